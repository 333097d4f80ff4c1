// Command etcdctl is upstream etcdctl's main, built from the pinned module version (the same
// release as the server), so the etcd image carries the client kubeadm's etcd image carries.
package main

import "go.etcd.io/etcd/etcdctl/v3/ctlv3"

func main() { ctlv3.MustStart() }
