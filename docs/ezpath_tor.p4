/* EZPath's top-of-rack switch as a P4_16 (v1model) program: the switch contract.
 *
 * This file is NOT the tested data plane, and it has not been compiled here (no p4c). No P4 compiler or software switch exists on the
 * machines peregrine is built on, so the data plane that runs (and that the tests exercise) is
 * bpf/ezpath_tor.bpf.c: tc programs on the ToR namespace's ports whose maps carry the same
 * table names, keys and actions as below, with max_entries standing in for SRAM. A P4 target
 * (BMv2, Tofino) would implement this program and the controller (internal/datapath/ezpath)
 * would write the same entries through P4Runtime instead of bpf map updates.
 *
 *   ezp_vlan_to_vni  (ingress_port, vlan.vid)            -> set_vni(vni)
 *   ezp_encap        (meta.vni, inner ipv4.dst)          -> vxlan_encap(remote_vtep)
 *   ezp_ipv4_lpm     (outer ipv4.dst, lpm)               -> set_nexthop(port, smac, dmac)
 *   ezp_decap        (outer ipv4.dst, vxlan.vni, inner ipv4.dst) -> decap_and_tag(port, vid)
 *   ezp_flow_bytes   register, index = hash(vni, inner 5-tuple), polled by the controller
 * Everything else is routed as plain IP (ipv4_lpm on the outer header).
 */
#include <core.p4>
#include <v1model.p4>

const bit<16> ETH_IPV4 = 0x0800;
const bit<16> ETH_VLAN = 0x8100;
const bit<8>  IP_UDP   = 17;
const bit<16> VXLAN_PORT = 4789;

header ethernet_t { bit<48> dst; bit<48> src; bit<16> type; }
header vlan_t     { bit<3> pcp; bit<1> dei; bit<12> vid; bit<16> type; }
header ipv4_t {
    bit<4> version; bit<4> ihl; bit<8> tos; bit<16> total_len; bit<16> id;
    bit<3> flags; bit<13> frag; bit<8> ttl; bit<8> proto; bit<16> csum;
    bit<32> src; bit<32> dst;
}
header udp_t   { bit<16> sport; bit<16> dport; bit<16> len; bit<16> csum; }
header vxlan_t { bit<8> flags; bit<24> rsvd; bit<24> vni; bit<8> rsvd2; }
header l4_t    { bit<16> sport; bit<16> dport; }

struct headers_t {
    ethernet_t outer_eth; ipv4_t outer_ip; udp_t outer_udp; vxlan_t vxlan;   /* pushed by encap */
    ethernet_t eth; vlan_t vlan; ipv4_t ip; udp_t udp; vxlan_t rx_vxlan;
    ethernet_t inner_eth; ipv4_t inner_ip; l4_t inner_l4;
}
struct meta_t { bit<24> vni; bit<32> remote_vtep; bit<12> vid; bit<32> my_vtep; }

parser EzpParser(packet_in pkt, out headers_t h, inout meta_t m, inout standard_metadata_t sm) {
    state start { pkt.extract(h.eth); transition select(h.eth.type) {
        ETH_VLAN: vlan; ETH_IPV4: ipv4; default: accept; } }
    state vlan { pkt.extract(h.vlan); transition select(h.vlan.type) { ETH_IPV4: ipv4; default: accept; } }
    state ipv4 { pkt.extract(h.ip); transition select(h.ip.proto) { IP_UDP: udp; default: accept; } }
    state udp  { pkt.extract(h.udp); transition select(h.udp.dport) { VXLAN_PORT: vxlan; default: accept; } }
    state vxlan { pkt.extract(h.rx_vxlan); pkt.extract(h.inner_eth); pkt.extract(h.inner_ip);
                  pkt.extract(h.inner_l4); transition accept; }
}

control EzpVerify(inout headers_t h, inout meta_t m) { apply { } }

control EzpIngress(inout headers_t h, inout meta_t m, inout standard_metadata_t sm) {
    register<bit<64>>(16384) ezp_flow_bytes;   /* LRU hash map in the eBPF data plane */

    action drop() { mark_to_drop(sm); }
    action set_vni(bit<24> vni) { m.vni = vni; }
    action vxlan_encap(bit<32> remote_vtep) { m.remote_vtep = remote_vtep; }
    action set_nexthop(bit<9> port, bit<48> smac, bit<48> dmac) {
        sm.egress_spec = port; h.outer_eth.src = smac; h.outer_eth.dst = dmac;
    }
    action decap_and_tag(bit<9> port, bit<12> vid) {
        h.eth.dst = h.inner_eth.dst; h.eth.src = h.inner_eth.src;
        h.eth.type = ETH_VLAN; h.vlan.setValid(); h.vlan.vid = vid; h.vlan.type = ETH_IPV4;
        h.ip = h.inner_ip;
        h.udp.setInvalid(); h.rx_vxlan.setInvalid(); h.inner_eth.setInvalid(); h.inner_ip.setInvalid();
        sm.egress_spec = port;
    }

    table ezp_vlan_to_vni { key = { sm.ingress_port: exact; h.vlan.vid: exact; }
                            actions = { set_vni; drop; } default_action = drop(); size = 4096; }
    table ezp_encap { key = { m.vni: exact; h.ip.dst: exact; }
                      actions = { vxlan_encap; drop; } default_action = drop(); size = 1024; }
    table ezp_ipv4_lpm { key = { m.remote_vtep: lpm; }
                         actions = { set_nexthop; drop; } default_action = drop(); size = 1024; }
    table ezp_decap { key = { h.ip.dst: exact; h.rx_vxlan.vni: exact; h.inner_ip.dst: exact; }
                      actions = { decap_and_tag; drop; NoAction; } default_action = NoAction(); size = 1024; }

    apply {
        if (h.vlan.isValid()) {                         /* from a host: an offloaded flow */
            ezp_vlan_to_vni.apply();
            ezp_encap.apply();
            bit<32> idx;
            hash(idx, HashAlgorithm.crc32, 32w0, { m.vni, h.ip.src, h.ip.dst, h.ip.proto }, 32w16384);
            bit<64> b; ezp_flow_bytes.read(b, idx); ezp_flow_bytes.write(idx, b + (bit<64>)sm.packet_length);
            h.outer_eth.setValid(); h.outer_ip.setValid(); h.outer_udp.setValid(); h.vxlan.setValid();
            h.outer_eth.type = ETH_IPV4;
            h.outer_ip.version = 4; h.outer_ip.ihl = 5; h.outer_ip.ttl = 64; h.outer_ip.proto = IP_UDP;
            h.outer_ip.src = m.my_vtep; h.outer_ip.dst = m.remote_vtep;
            h.outer_ip.total_len = h.ip.total_len + 50;
            h.outer_udp.dport = VXLAN_PORT; h.outer_udp.len = h.ip.total_len + 30;
            h.vxlan.flags = 0x08; h.vxlan.vni = m.vni;
            h.eth.type = ETH_IPV4; h.vlan.setInvalid();   /* the original frame becomes the inner one */
            ezp_ipv4_lpm.apply();
        } else if (h.rx_vxlan.isValid()) {              /* VXLAN: ours to end, or in transit */
            if (ezp_decap.apply().miss) {
                bit<32> idx;
                hash(idx, HashAlgorithm.crc32, 32w0, { h.rx_vxlan.vni, h.inner_ip.src, h.inner_ip.dst, h.inner_ip.proto }, 32w16384);
                bit<64> b; ezp_flow_bytes.read(b, idx); ezp_flow_bytes.write(idx, b + (bit<64>)sm.packet_length);
                /* plain IP routing of the outer header follows (omitted: the lab's ToR routes) */
            }
        }
    }
}

control EzpEgress(inout headers_t h, inout meta_t m, inout standard_metadata_t sm) { apply { } }
control EzpCompute(inout headers_t h, inout meta_t m) {
    apply {
        update_checksum(h.outer_ip.isValid(), { h.outer_ip.version, h.outer_ip.ihl, h.outer_ip.tos,
            h.outer_ip.total_len, h.outer_ip.id, h.outer_ip.flags, h.outer_ip.frag, h.outer_ip.ttl,
            h.outer_ip.proto, h.outer_ip.src, h.outer_ip.dst }, h.outer_ip.csum, HashAlgorithm.csum16);
    }
}
control EzpDeparser(packet_out pkt, in headers_t h) {
    apply {
        pkt.emit(h.outer_eth); pkt.emit(h.outer_ip); pkt.emit(h.outer_udp); pkt.emit(h.vxlan);
        pkt.emit(h.eth); pkt.emit(h.vlan); pkt.emit(h.ip); pkt.emit(h.udp); pkt.emit(h.rx_vxlan);
        pkt.emit(h.inner_eth); pkt.emit(h.inner_ip); pkt.emit(h.inner_l4);
    }
}

V1Switch(EzpParser(), EzpVerify(), EzpIngress(), EzpEgress(), EzpCompute(), EzpDeparser()) main;
