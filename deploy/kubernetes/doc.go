// Package kubernetes holds the relay's Kubernetes manifests and the test that decodes
// each strictly into the Kubernetes API types and checks what a platform team
// expects of them. It is a module of its own: k8s.io/api never enters the library's
// module graph.
package kubernetes
