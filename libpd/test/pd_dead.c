/* What every libpd call says once the daemon is gone (pd.h: ECONNRESET, never EAGAIN or 0
 * forever). internal/pipedevice's TestDaemonGoneEveryCall builds it from pd.h alone, links it
 * with libpd.so and drives it:
 *   pd_dead SOCKET PORT
 * It sets up a listener and a connected pair, prints "ready" and waits for a line (the test
 * stops the daemon), sends one pool buffer (queued, never completed: the buffer stays in flight),
 * prints "sent" and waits for a line (the test kills the daemon with SIGKILL and reaps it). Then a
 * sender waiting for its buffer must hear ECONNRESET at once, not spin, and so must every entry
 * point. Prints "OK ..." and exits 0, or "FAIL: ..." and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "pd.h"

#define EXPECT_RESET(call) \
	do { errno = 0; CHECK((call) < 0 && errno == ECONNRESET, "%s: want -1/ECONNRESET", #call); } while (0)

static double ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

static void step(const char *say)
{
	char line[64];
	printf("%s\n", say);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin)) {
		printf("FAIL: stdin closed after %s\n", say);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: pd_dead SOCKET PORT\n");
		return 2;
	}
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (pd_init(argv[1], 0, 0) < 0) {
		printf("FAIL: pd_init: %s\n", strerror(errno));
		return 1;
	}
	int l = pd_socket(AF_INET, SOCK_STREAM, 0), c = pd_socket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0 && c >= 0, "pd_socket");
	CHECK(pd_bind(l, (struct sockaddr *)&sa, sizeof sa) == 0 && pd_listen(l, 4) == 0, "bind, listen");
	CHECK(pd_connect(c, (struct sockaddr *)&sa, sizeof sa) == 0, "pd_connect");
	int ep = pd_epoll_create(4);
	struct pd_epoll_event ev = { .events = PD_EPOLLIN, .data.sid = l }, out[8];
	CHECK(ep >= 0 && pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, l, &ev) == 0, "epoll");
	CHECK(pd_epoll_wait(ep, out, 8, 5000) == 1, "a connection to accept");
	int s = pd_accept(l, NULL, NULL);
	CHECK(s >= 0, "pd_accept");
	ev = (struct pd_epoll_event){ .events = PD_EPOLLIN, .data.sid = s };
	CHECK(pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, s, &ev) == 0, "epoll add");
	void *buf = pd_malloc(4096);
	CHECK(buf != NULL, "pd_malloc");
	if (fails)
		return 1;
	memset(buf, 7, 4096);

	step("ready"); /* the daemon is stopped now: what we send stays in flight */
	CHECK(pd_send(c, buf, 4096) == 4096, "pd_send to a stopped daemon queues");
	CHECK(pd_buf_refresh(c, &buf, 1) == 0, "the buffer is in flight");

	step("sent"); /* the daemon is killed and reaped now */
	/* a sender waiting for its buffer (pd_buf_refresh), as the examples do: it must learn at
	 * once; before issue 28 it got 0 forever */
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	long spins = 0;
	int n;
	errno = 0;
	while ((n = pd_buf_refresh(c, &buf, 1)) == 0 && ms_since(&t0) < 2000)
		spins++;
	double waited = ms_since(&t0);
	CHECK(n < 0 && errno == ECONNRESET, "pd_buf_refresh after %ld calls, %.1f ms: %d, want -1/ECONNRESET", spins, waited, n);
	CHECK(waited < 100, "the waiting sender took %.1f ms to learn", waited);

	/* every entry point, each with arguments that would otherwise be good */
	void *rb;
	int v = 0;
	socklen_t vl = sizeof v;
	errno = 0;
	CHECK(pd_malloc(64) == NULL && errno == ECONNRESET, "pd_malloc: want NULL/ECONNRESET");
	EXPECT_RESET(pd_send(c, buf, 1));
	EXPECT_RESET(pd_buf_refresh(c, &buf, 1));
	EXPECT_RESET(pd_recv(s, 100, &rb));
	EXPECT_RESET(pd_recv_done(s, 0));
	EXPECT_RESET(pd_getsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, &vl));
	for (int i = 0; i < 2; i++) { /* not cleared by reading it */
		v = 0;
		CHECK(pd_getsockopt(c, SOL_SOCKET, SO_ERROR, &v, &vl) == 0 && v == ECONNRESET, "SO_ERROR is %d, want ECONNRESET", v);
	}
	v = 1 << 20;
	EXPECT_RESET(pd_setsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, sizeof v));
	EXPECT_RESET(pd_socket(AF_INET, SOCK_STREAM, 0));
	EXPECT_RESET(pd_bind(c, (struct sockaddr *)&sa, sizeof sa));
	EXPECT_RESET(pd_listen(c, 4));
	EXPECT_RESET(pd_accept(l, NULL, NULL));
	EXPECT_RESET(pd_connect(c, (struct sockaddr *)&sa, sizeof sa));
	EXPECT_RESET(pd_epoll_create(1));
	ev = (struct pd_epoll_event){ .events = PD_EPOLLOUT, .data.sid = c };
	EXPECT_RESET(pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, c, &ev));
	struct timespec tw;
	clock_gettime(CLOCK_MONOTONIC, &tw);
	n = pd_epoll_wait(ep, out, 8, 1000);
	CHECK(n == 2 && out[0].events == (PD_EPOLLERR | PD_EPOLLHUP) && out[1].events == (PD_EPOLLERR | PD_EPOLLHUP) &&
		      ms_since(&tw) < 100,
	      "pd_epoll_wait: %d events (%#x), %.1f ms; want both watched sockets with ERR|HUP at once", n,
	      n > 0 ? out[0].events : 0, ms_since(&tw));
	EXPECT_RESET(pd_init(argv[1], 0, 0));
	EXPECT_RESET(pd_close(c));
	EXPECT_RESET(pd_close(c)); /* released by the first: still the daemon's end that is said */
	pd_free(buf);
	pd_release();
	/* afresh: no EALREADY; there is no daemon to connect to */
	errno = 0;
	CHECK(pd_init(argv[1], 0, 0) < 0 && errno != EALREADY && errno != ECONNRESET, "pd_init after pd_release");
	errno = 0;
	CHECK(pd_socket(AF_INET, SOCK_STREAM, 0) < 0 && errno == ENOTCONN, "pd_socket with no daemon: want ENOTCONN");
	if (fails)
		return 1;
	printf("OK every call said ECONNRESET; the waiting sender learned after %ld calls, %.2f ms\n", spins, waited);
	return 0;
}
