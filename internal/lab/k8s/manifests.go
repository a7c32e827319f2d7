package k8s

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// WebNodePort is the test Service web-np's NodePort.
const WebNodePort = 30080

// baseRBAC lets flanneld, kube-proxy and kube-router do their work as their own users (what
// kube-flannel.yml, kubeadm and kube-router's manifests grant their service accounts).
const baseRBAC = `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: prg-flannel}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get]}
- {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}
- {apiGroups: [""], resources: [nodes/status], verbs: [patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: prg-flannel}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: prg-flannel}
subjects: [{kind: User, name: flannel}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: prg-kube-proxy}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node-proxier}
subjects: [{kind: User, name: system:kube-proxy}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: prg-kube-router}
rules:
- {apiGroups: [""], resources: [namespaces, pods, services, nodes, endpoints], verbs: [get, list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}
- {apiGroups: [networking.k8s.io], resources: [networkpolicies], verbs: [get, list, watch]}
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, list, watch, create, update, patch, delete]}
- {apiGroups: [""], resources: [events], verbs: [create, patch, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: prg-kube-router}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: prg-kube-router}
subjects: [{kind: User, name: kube-router}]
`

// workloads: Deployment web (busybox httpd answering its own pod name, spread over the nodes)
// with a ClusterIP Service and a NodePort Service.
func workloads(replicas int) string {
	return fmt.Sprintf(`
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: %d
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      enableServiceLinks: false
      dnsPolicy: Default
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      containers:
      - name: httpd
        image: %s
        imagePullPolicy: Never
        command: ["sh", "-c", "mkdir -p /www && echo $(hostname) > /www/index.html && exec httpd -f -p 8080 -h /www"]
        ports: [{containerPort: 8080}]
        readinessProbe:
          tcpSocket: {port: 8080}
          periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-np, namespace: default}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080, nodePort: %d}]
`, replicas, BusyboxImage, WebNodePort)
}

func (c *Cluster) applyBase(ctx context.Context) error {
	_, err := c.KubectlIn(ctx, baseRBAC, "apply", "-f", "-")
	return err
}

func (c *Cluster) applyWorkloads(ctx context.Context) error {
	_, err := c.KubectlIn(ctx, workloads(2*c.Spec.Nodes), "apply", "-f", "-")
	return err
}

func (c *Cluster) waitWorkloads(ctx context.Context) error {
	if _, err := c.Kubectl(ctx, "rollout", "status", "deployment/web", "--timeout=120s"); err != nil {
		return err
	}
	return nil
}

// Pod is a pod as the lab's checks and tests see it.
type Pod struct {
	Name string
	Node string
	IP   string
}

// Pods lists the pods matching a label selector in namespace ns (running, with an IP).
func (c *Cluster) Pods(ctx context.Context, ns, selector string) ([]Pod, error) {
	out, err := c.Kubectl(ctx, "get", "pods", "-n", ns, "-l", selector, "--field-selector=status.phase=Running", "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.metadata.deletionTimestamp}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	var ps []Pod
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 { // a pod being deleted has a 4th field
			ps = append(ps, Pod{Name: f[0], Node: f[1], IP: f[2]})
		}
	}
	return ps, nil
}

// Get fetches http://host:port/ from inside pod (busybox's wget crashes: a raw request over nc)
// and returns the body's first line.
func (c *Cluster) Get(ctx context.Context, pod, host string, port int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := c.Kubectl(ctx, "exec", pod, "--", "sh", "-c",
		fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 %s %d`, host, port))
	if err != nil {
		return "", err
	}
	_, body, ok := strings.Cut(out, "\r\n\r\n")
	if !ok {
		return "", fmt.Errorf("%s -> %s:%d: no HTTP answer: %q", pod, host, port, out)
	}
	return strings.TrimSpace(body), nil
}

// Verify proves pod to pod on one node and across nodes (VXLAN), and pod to the ClusterIP.
func (c *Cluster) Verify(ctx context.Context) error {
	pods, err := c.Pods(ctx, "default", "app=web")
	if err != nil {
		return err
	}
	byNode := map[string][]Pod{}
	for _, p := range pods {
		byNode[p.Node] = append(byNode[p.Node], p)
	}
	a := byNode[NodeName(1)]
	if len(a) < 2 {
		return fmt.Errorf("want 2 web pods on %s, have %v", NodeName(1), pods)
	}
	checks := []struct {
		what string
		to   string
		port int
		want string
	}{{"same node", a[1].IP, 8080, a[1].Name}}
	if c.Spec.Nodes > 1 {
		b := byNode[NodeName(2)]
		if len(b) == 0 {
			return fmt.Errorf("no web pod on %s: %v", NodeName(2), pods)
		}
		checks = append(checks, struct {
			what string
			to   string
			port int
			want string
		}{"across VXLAN", b[0].IP, 8080, b[0].Name})
	}
	for _, ch := range checks {
		got, err := c.Get(ctx, a[0].Name, ch.to, ch.port)
		if err != nil {
			return fmt.Errorf("pod to pod (%s) %s -> %s: %w", ch.what, a[0].Name, ch.to, err)
		}
		if got != ch.want {
			return fmt.Errorf("pod to pod (%s) %s -> %s answered %q, want %q", ch.what, a[0].Name, ch.to, got, ch.want)
		}
	}
	svc, err := c.Kubectl(ctx, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		return err
	}
	names := map[string]bool{}
	for _, p := range pods {
		names[p.Name] = true
	}
	// kube-proxy may still be writing the rules for a Service created a moment ago.
	return waitFor(ctx, 20*time.Second, 200*time.Millisecond, "pod to ClusterIP "+svc+":80", func() (bool, error) {
		got, err := c.Get(ctx, a[0].Name, svc, 80)
		if err != nil {
			return false, err
		}
		if !names[got] {
			return false, fmt.Errorf("answered %q, not a web pod", got)
		}
		return true, nil
	})
}
