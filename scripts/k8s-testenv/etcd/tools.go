//go:build tools

// The etcd server command; this file only pins it for `go mod tidy`.
package tools

import _ "go.etcd.io/etcd/server/v3"
