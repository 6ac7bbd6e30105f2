package natsx

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// leaderGet reads one message of the bucket's stream from its leader: by
// sequence, or the last of a subject when subject is set. A bucket with
// direct get on answers the stream's own GetMsg from any replica, and a
// replica behind may not hold a message the leader acknowledged; this asks
// the JetStream API (STREAM.MSG.GET), which only the leader answers. A
// bucket read from its leader already (direct get off) uses the stream's
// calls. A message not there is jetstream.ErrMsgNotFound.
func (k *KV) leaderGet(ctx context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	if !k.direct {
		if subject != "" {
			return k.stream.GetLastMsgForSubject(ctx, subject)
		}
		return k.stream.GetMsg(ctx, seq)
	}
	req := struct {
		Seq     uint64 `json:"seq,omitempty"`
		LastFor string `json:"last_by_subj,omitempty"`
	}{Seq: seq, LastFor: subject}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	name := k.stream.CachedInfo().Config.Name
	reply, err := k.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+name, body)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("stream %s: message get answer: %w", name, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrCode == jetstreamErrNoMessageFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, fmt.Errorf("stream %s: message get: %s (code %d, error code %d)", name, resp.Error.Description, resp.Error.Code, resp.Error.ErrCode)
	}
	if resp.Message == nil {
		return nil, fmt.Errorf("stream %s: message get answered no message", name)
	}
	m := resp.Message
	var hdr nats.Header
	if len(m.Header) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(m.Header); err != nil {
			return nil, fmt.Errorf("stream %s: message %d headers: %w", name, m.Seq, err)
		}
	}
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Seq, Header: hdr, Data: m.Data, Time: m.Time}, nil
}

// jetstreamErrNoMessageFound is the JetStream API error code of a message
// get that finds none (JSNoMessageFoundErr).
const jetstreamErrNoMessageFound = 10037
