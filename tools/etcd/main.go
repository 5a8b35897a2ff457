// Command etcd is the etcd server, built from the go.etcd.io/etcd/server/v3 module at the version
// tools/go.mod pins (the upstream main lives in the etcd root module, which go build cannot use
// as a dependency because of its replace directives).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
