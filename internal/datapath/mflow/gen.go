// Package mflow is MFLOW (IPDPS'23, dissertation ch. 4) as a datapath mode on a stock kernel:
// one elephant flow is cut into micro-flows (batches of B consecutive packets) processed on
// several splitting CPUs in parallel.
//
//   - full-path scaling (--split-at full-path, the default, MFLOW's TCP setting): the IRQ split.
//     XDP on the underlay numbers an elephant's frames and sends each batch through a cpumap to
//     the next splitting CPU, before any skb exists (grosplit in MFlow mode). That CPU builds
//     the skb, runs GRO and every later stage: VXLAN, bridge, veth, the transport. The RPS masks
//     of the underlay, VXLAN devices and container veths are cleared (recorded, restored), since
//     RPS after the split would gather the flow on one CPU again.
//   - device scaling (--split-at device, MFLOW's UDP setting): a tcx program on the underlay's
//     ingress, after the NIC stage (skb, GRO) on the IRQ core, gives each batch a hash that the
//     VXLAN devices' RPS (rps_cpus = the splitting CPUs) maps to the batch's CPU.
//   - elephant detection: only flows at or above --elephant-pps or --elephant-bps over the last
//     --window are split; mice take the normal path (bpf/mflow.h).
//   - merge (--merge): a tcx program on every bridge port gives a split flow one fixed hash, so
//     the container veth's RPS runs the transport of all its batches on ONE CPU.
//
// In-order delivery: MFLOW reassembles batches in tcp_recvmsg/udp_recvmsg with a merging
// counter. A stock kernel has no hook that can hold and reorder skbs on ingress (no BPF qdisc on
// our 6.18 build, and tc/XDP programs can only pass, drop or redirect a packet, never park it),
// so what reaches the transport is reordered at batch boundaries and TCP's out-of-order queue
// is the backstop. Status shows the receivers' reordering counters; bench measures them.
// See NOTES.md in this directory for the measured figures and what a kernel patch would add.
package mflow

//go:generate go tool bpf2go -tags linux -target bpfel -output-stem mflow_bpf mf ../../../bpf/mflow.bpf.c -- -nostdinc -I../../../bpf -I../../../bpf/include -g -O2 -Wall -mcpu=v3
