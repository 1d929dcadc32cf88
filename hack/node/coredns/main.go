// CoreDNS as released, with only the plugins the local cluster's Corefile names
// (localcluster/dns.py): the full set compiles the cloud providers' SDKs too, about 40 % more
// source, for plugins a local cluster never loads.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

// The order in which a server block's plugins run: CoreDNS's own order (plugin.cfg) for these.
func init() {
	dnsserver.Directives = []string{"bind", "errors", "kubernetes"}
}

func main() { coremain.Run() }
