// Package supervise runs a service's long-running loops (watchers, lease
// renewal, stream senders, the server) under one supervisor: when one ends
// with an error or panics, the others are cancelled and Run returns the
// first error, so a service never limps on with a dead loop.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
)

// Task is one named loop. It should return nil only when ctx is done.
type Task struct {
	Name string
	Run  func(ctx context.Context) error
}

// ErrEnded is returned when a task returned nil while ctx was still live:
// a loop that stops silently is a failure of the service.
var ErrEnded = errors.New("ended on its own")

// Run runs every task until ctx is done or one fails. It returns nil when
// ctx ended everything, else the first failure, naming its task.
func Run(ctx context.Context, tasks ...Task) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		once  sync.Once
		first error
		wg    sync.WaitGroup
	)
	for _, t := range tasks {
		wg.Add(1)
		go func(t Task) {
			defer wg.Done()
			err := call(ctx, t)
			if err == nil && ctx.Err() == nil {
				err = fmt.Errorf("%s: %w", t.Name, ErrEnded)
			}
			if err != nil && ctx.Err() == nil {
				once.Do(func() { first = err })
				cancel()
			}
		}(t)
	}
	wg.Wait()
	return first
}

func call(ctx context.Context, t Task) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s panicked: %v\n%s", t.Name, r, debug.Stack())
		}
	}()
	if err := t.Run(ctx); err != nil {
		return fmt.Errorf("%s: %w", t.Name, err)
	}
	return nil
}
