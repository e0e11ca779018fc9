// The etcd server, as go.etcd.io/etcd/server/v3's own main.go builds it; this module pins its version
// (../versions.env) so the binary is named etcd and built like the rest of the control plane (../build.sh).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
