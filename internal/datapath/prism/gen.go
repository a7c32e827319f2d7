// Package prism is PRISM's run-to-completion (sync) mode for high-priority overlay flows on a
// stock kernel: a tc program at ingress of the VXLAN device classifies each decapsulated frame
// by its inner headers and hands HP frames with bpf_redirect_peer straight to the container, past
// the bridge and the veth backlog stage. bpf/prism.bpf.c explains the datapath.
//
// The mode registers itself as "prism" with the datapath package. Rules are changed live
// (`peregrine prism add|del|rules`); a node agent (`peregrine agent prism`) keeps the endpoint
// map current as containers come and go.
//
// # HP isolation (--hp-cpus)
//
// `attach prism --hp-cpus LIST` reserves CPUs for HP processing by RPS hash steering: a second
// program, prg_prism_nic, at tcx ingress of the underlay (after the NIC stage's GRO, before
// vxlan_rcv) classifies the inner frame of every VXLAN frame with the same live rules and writes
// an L4 hash with bpf_set_hash. The hash survives decapsulation, and the VXLAN devices' RPS (mask
// = the reserved CPUs plus the LP CPUs, rps_flow_cnt 0, recorded as knobs and restored on detach)
// maps it to a reserved CPU for HP and to a non-reserved one for everything else, flows spread by
// their inner 5-tuple within each class. LP CPUs are attach's --cpus, or every online CPU that is
// not reserved; reserving all of them is refused, because LP would then share the reserved
// backlogs again (plain prism without --hp-cpus is that configuration). From the VXLAN device's
// backlog on (prg_prism_vx, the redirect or the bridge, the container's stack) HP never shares a
// queue with bulk traffic. What stays shared: the NIC stage (the IRQ core's NAPI poll or backlog,
// GRO, IP/UDP, vxlan_rcv) and the VXLAN gro_cell, both before RPS. An HP packet still waits
// behind whatever the IRQ core has queued ahead of it, LP packets of every stage on that core
// included, so the gain needs LP's later stages off the IRQ core too, i.e. at least three CPUs
// (IRQ, LP, HP). On a 2-vCPU machine LP's later stages stay on the IRQ core.
//
// Not done: XDP + cpumap on the underlay, which would take HP off the IRQ core before skb
// allocation and GRO. It needs the one XDP slot of the underlay, which grosplit and mflow use, and
// in the lab the underlay is a veth whose native XDP runs in the veth's NAPI on the sending CPU,
// not on the emulated IRQ core (the lab emulates the IRQ core with RPS, after XDP).
//
// # Why no batch-priority mode
//
// PRISM-batch gives each device H and L queues, serves H first and puts a device with H work at
// the head of the CPU's poll list (the PRISM paper, §II and §IV). A stock kernel has neither: the
// per-CPU backlog (input_pkt_queue/process_queue), the gro_cell queue, the veth ptr_ring and the
// driver rings are single FIFOs; net_rx_action's poll_list order, napi_poll's budget and
// process_backlog are not programmable (BPF qdiscs are egress only, sched_ext schedules tasks, not
// softirqs, and threaded NAPI priorities cannot reorder packets inside one shared backlog). A BPF
// program can label a packet (skb->priority, mark, hash) but nothing in NAPI, GRO cells or the
// backlog acts on the label. So on a stock kernel priority is replaced by isolation: HP gets its
// own queues by getting its own CPUs (--hp-cpus), and skips queues by running to completion
// (the sync mode). Batch priority needs the kernel patch: H/L queues in softnet_data and
// gro_cell, head insertion into poll_list and the single-list net_rx_action.
package prism

// The generated prism_bpf_bpfel.{go,o} are committed so that `go build` needs no clang.
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem prism_bpf prs ../../../bpf/prism.bpf.c -- -nostdinc -I../../../bpf -I../../../bpf/include -g -O2 -Wall -mcpu=v3
