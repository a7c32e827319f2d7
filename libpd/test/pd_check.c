/* A check of libpd against a running daemon, built from pd.h alone and linked with libpd.so
 * (internal/pipedevice's TestCLibrary builds and runs it):
 *   pd_check SOCKET PORT BYTES
 * Both ends live in this process: errors of every call, connection setup with epoll, a transfer
 * of BYTES checked byte by byte (odd message sizes, many ring wrap-arounds), the end of stream.
 * Prints "OK ..." and exits 0, or "FAIL: ..." and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "pd.h"

#define EXPECT_ERR(call, want) CHECK((call) < 0 && errno == (want), "%s: want errno %s", #call, #want)

static unsigned char pat(unsigned long long i) { return (unsigned char)(i * 7 ^ (i >> 13)); }

static struct sockaddr_in addr(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: pd_check SOCKET PORT BYTES\n");
		return 2;
	}
	int port = atoi(argv[2]);
	unsigned long long total = strtoull(argv[3], NULL, 0);

	EXPECT_ERR(pd_socket(AF_INET, SOCK_STREAM, 0), ENOTCONN); /* before pd_init */
	CHECK(pd_init(argv[1], 0, 0) == 0, "pd_init");
	EXPECT_ERR(pd_init(argv[1], 0, 0), EALREADY);
	EXPECT_ERR(pd_socket(AF_INET6, SOCK_STREAM, 0), EINVAL);
	EXPECT_ERR(pd_socket(AF_INET, SOCK_DGRAM, 0), EINVAL);
	EXPECT_ERR(pd_close(12345), EBADF);

	int l = pd_socket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0, "pd_socket");
	struct sockaddr_in foreign = addr("203.0.113.9", port);
	EXPECT_ERR(pd_bind(l, (struct sockaddr *)&foreign, sizeof foreign), EADDRNOTAVAIL);
	struct sockaddr_in sa = addr("127.0.0.1", port);
	EXPECT_ERR(pd_bind(l, (struct sockaddr *)&sa, 3), EINVAL);
	CHECK(pd_bind(l, (struct sockaddr *)&sa, sizeof sa) == 0, "pd_bind");
	CHECK(pd_listen(l, 8) == 0, "pd_listen");
	struct sockaddr_in peer;
	socklen_t plen = sizeof peer;
	EXPECT_ERR(pd_accept(l, (struct sockaddr *)&peer, &plen), EAGAIN);

	int c = pd_socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in nowhere = addr("127.0.0.1", port + 1);
	EXPECT_ERR(pd_connect(c, (struct sockaddr *)&nowhere, sizeof nowhere), ECONNREFUSED);

	int ep = pd_epoll_create(4);
	CHECK(ep >= 0, "pd_epoll_create");
	struct pd_epoll_event ev = { .events = PD_EPOLLIN, .data.u64 = 1 }, out[4];
	CHECK(pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, l, &ev) == 0, "epoll add listener");
	EXPECT_ERR(pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, l, &ev), EEXIST);
	CHECK(pd_epoll_wait(ep, out, 4, 0) == 0, "no event before a connect");
	CHECK(pd_connect(c, (struct sockaddr *)&sa, sizeof sa) == 0, "pd_connect");
	int n = pd_epoll_wait(ep, out, 4, 5000);
	CHECK(n == 1 && (out[0].events & PD_EPOLLIN) && out[0].data.u64 == 1, "listener readable after connect (n=%d)", n);
	int s = pd_accept(l, (struct sockaddr *)&peer, &plen);
	CHECK(s >= 0 && plen == sizeof peer && peer.sin_addr.s_addr == htonl(0x7f000001), "pd_accept and the peer's address");

	int v;
	socklen_t vl = sizeof v;
	CHECK(pd_getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &vl) == 0 && v == SOCK_STREAM, "SO_TYPE");
	CHECK(pd_getsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, &vl) == 0 && v >= 4096, "SO_RCVBUF");
	size_t ring = (size_t)v;
	CHECK(pd_getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &vl) == 0 && v == 0, "SO_ERROR");
	EXPECT_ERR(pd_getsockopt(s, IPPROTO_TCP, 1, &v, &vl), ENOPROTOOPT);

	char stack[64];
	EXPECT_ERR(pd_send(c, stack, sizeof stack), EFAULT); /* not from pd_malloc */
	void *rb;
	EXPECT_ERR(pd_recv(s, 100, &rb), EAGAIN);
	EXPECT_ERR(pd_recv_done(s, 1), EINVAL);

	struct pd_epoll_event cev = { .events = PD_EPOLLOUT, .data.sid = c };
	CHECK(pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, c, &cev) == 0, "epoll add client");
	struct pd_epoll_event sev = { .events = PD_EPOLLIN, .data.sid = s };
	CHECK(pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, s, &sev) == 0, "epoll add server");
	CHECK(pd_epoll_ctl(ep, PD_EPOLL_CTL_DEL, l, NULL) == 0, "epoll del listener");

	/* the transfer: one thread drives both ends */
	size_t msg = 65536 + 333;
	if (msg > ring / 2)
		msg = ring / 2 + 77; /* direct mode reserves whole messages in the peer's ring */
	void *bufs[4];
	int nbuf = 0;
	void *cur = NULL;
	size_t curlen = 0, curoff = 0;
	unsigned long long sent = 0, got = 0;
	long rounds = 0;
	while (got < total && !fails) {
		if (++rounds > 50000000) {
			CHECK(0, "no progress: sent %llu, got %llu", sent, got);
			break;
		}
		if (!cur && sent < total) {
			curlen = total - sent < msg ? total - sent : msg;
			if (nbuf == 4 && pd_buf_refresh(c, bufs, nbuf) > 0) {
				cur = bufs[0];
			} else {
				if (nbuf == 4)
					pd_free(bufs[--nbuf]);
				cur = pd_malloc(msg);
				if (cur)
					bufs[nbuf++] = cur;
			}
			if (cur) {
				for (size_t i = 0; i < curlen; i++)
					((unsigned char *)cur)[i] = pat(sent + i);
				curoff = 0;
			}
		}
		if (cur) {
			ssize_t k = pd_send(c, (char *)cur + curoff, curlen - curoff);
			if (k > 0) {
				curoff += k;
				if (curoff == curlen) {
					sent += curlen;
					cur = NULL;
				}
			} else {
				CHECK(errno == EAGAIN, "pd_send");
			}
		}
		ssize_t r = pd_recv(s, 1 << 20, &rb);
		if (r > 0) {
			for (ssize_t i = 0; i < r; i++)
				if (((unsigned char *)rb)[i] != pat(got + i)) {
					CHECK(0, "byte %llu is %#x, want %#x", got + i, ((unsigned char *)rb)[i], pat(got + i));
					break;
				}
			got += r;
			CHECK(pd_recv_done(s, r) == 0, "pd_recv_done");
		} else if (r < 0) {
			CHECK(errno == EAGAIN, "pd_recv");
			if (!cur || errno == EAGAIN)
				pd_epoll_wait(ep, out, 4, 10);
		} else {
			CHECK(0, "early end of stream");
			break;
		}
	}
	CHECK(got == total && sent == total, "moved %llu of %llu", got, total);

	/* level-triggered EPOLLOUT on an idle connection with room */
	n = pd_epoll_wait(ep, out, 4, 0);
	int sawout = 0;
	for (int i = 0; i < n; i++)
		if (out[i].data.sid == c && (out[i].events & PD_EPOLLOUT))
			sawout = 1;
	CHECK(sawout, "EPOLLOUT on a connection with room");

	/* the client closes: the server sees HUP, the end of stream, and EPIPE on send */
	for (int i = 0; i < nbuf; i++)
		pd_free(bufs[i]);
	CHECK(pd_close(c) == 0, "pd_close client");
	int hup = 0;
	for (int i = 0; i < 500 && !hup; i++) {
		n = pd_epoll_wait(ep, out, 4, 10);
		for (int j = 0; j < n; j++) {
			CHECK(out[j].data.sid != c, "a closed socket is still in the epoll set");
			if (out[j].data.sid == s && (out[j].events & PD_EPOLLHUP))
				hup = 1;
		}
	}
	CHECK(hup, "EPOLLHUP after the peer closed");
	CHECK(pd_recv(s, 100, &rb) == 0, "pd_recv returns 0 at the end of stream");
	void *b = pd_malloc(100);
	if (b) {
		EXPECT_ERR(pd_send(s, b, 100), EPIPE);
		pd_free(b);
	} else {
		CHECK(errno == EPIPE, "pd_malloc after the peer closed (direct mode)");
	}
	CHECK(pd_close(s) == 0 && pd_close(l) == 0, "pd_close");
	EXPECT_ERR(pd_close(s), EBADF);
	pd_release();
	if (fails)
		return 1;
	printf("OK %llu bytes\n", got);
	return 0;
}
