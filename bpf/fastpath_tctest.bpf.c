// SPDX-License-Identifier: GPL-2.0
/*
 * fastpath_tctest: the fast path's programs (fastpath.bpf.c, included whole) and, for tests only,
 * the flannel layout's four programs run with their hand-over tag (skb->tc_index:
 * FP_TC_INDEX_OUT/NOOUT, PRG_TC_INDEX_LEARN, FP_TC_INDEX_NOIN) taken from cb[0] and given back
 * there: BPF_PROG_TEST_RUN can neither set nor return tc_index (budget_prog_test.go). A separate
 * object, compiled into the tests only, so attaching never verifies these copies.
 */
#include "fastpath.bpf.c"

#define FP_TC_INDEX_TEST(name, sec, main)                                                                              \
	SEC(sec)                                                                                                       \
	int name(struct __sk_buff *ctx)                                                                                \
	{                                                                                                              \
		ctx->tc_index = ctx->cb[0];                                                                            \
		int r = main(ctx);                                                                                     \
		ctx->cb[0] = ctx->tc_index;                                                                            \
		return r;                                                                                              \
	}
FP_TC_INDEX_TEST(prg_fastpath_tx_t, "tcx/ingress", tx_main)
FP_TC_INDEX_TEST(prg_fastpath_rx_t, "tcx/ingress", rx_main)
FP_TC_INDEX_TEST(prg_fastpath_lrn_tx_t, "tcx/egress", lrn_tx_main)
FP_TC_INDEX_TEST(prg_fastpath_lrn_rx_t, "tcx/egress", lrn_rx_main)
