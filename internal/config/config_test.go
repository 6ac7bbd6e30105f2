package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type sample struct {
	Listen   string   `yaml:"listen"`
	Lifetime Duration `yaml:"lifetime"`
	Prefixes []string `yaml:"prefixes"`
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name, body, wantErr string
	}{
		{"good", "listen: :7402\nlifetime: 12h\nprefixes: [/etc]\n", ""},
		{"unknown key", "listen: :7402\nlisten_addr: x\n", "listen_addr"},
		{"bad duration", "lifetime: forever\n", "not a duration"},
		{"empty file", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, c.name+".yaml")
			os.WriteFile(path, []byte(c.body), 0o644)
			var s sample
			err := Load(path, &s)
			if c.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.name == "good" && (s.Listen != ":7402" || time.Duration(s.Lifetime) != 12*time.Hour || s.Prefixes[0] != "/etc") {
					t.Errorf("decoded %+v", s)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Load = %v, want %q", err, c.wantErr)
			}
		})
	}
	if err := Required([2]string{"listen", "x"}, [2]string{"state_dir", ""}); err == nil || !strings.Contains(err.Error(), "state_dir") {
		t.Errorf("Required = %v", err)
	}
}
