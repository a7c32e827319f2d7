/* The server half of the paper's Listing 1, as a runnable program:
 *   pd-example-server [ip] [port]     (default 127.0.0.1 5201)
 * accepts one connection, receives until the client closes, prints bytes and a checksum. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pd.h"

static int die(const char *what)
{
	fprintf(stderr, "server: %s: %s\n", what, strerror(errno));
	return 1;
}

int main(int argc, char **argv)
{
	struct sockaddr_in serv = { .sin_family = AF_INET };
	inet_pton(AF_INET, argc > 1 ? argv[1] : "127.0.0.1", &serv.sin_addr);
	serv.sin_port = htons(argc > 2 ? atoi(argv[2]) : 5201);

	if (pd_init(NULL, 0, 0) < 0)
		return die("pd_init (is `peregrine pd daemon` running?)");
	int sid = pd_socket(AF_INET, SOCK_STREAM, 0);
	if (sid < 0 || pd_bind(sid, (struct sockaddr *)&serv, sizeof serv) < 0 || pd_listen(sid, 16) < 0)
		return die("socket/bind/listen");

	/* wait for a connection: the listening socket becomes readable */
	int ep = pd_epoll_create(2);
	struct pd_epoll_event ev = { .events = PD_EPOLLIN, .data.sid = sid }, out[2];
	pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, sid, &ev);
	struct sockaddr_in cli;
	socklen_t len = sizeof cli;
	int acc;
	while ((acc = pd_accept(sid, (struct sockaddr *)&cli, &len)) < 0) {
		if (errno != EAGAIN)
			return die("pd_accept");
		if (pd_epoll_wait(ep, out, 2, -1) < 0)
			return die("pd_epoll_wait");
	}
	ev.data.sid = acc;
	pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, acc, &ev);

	unsigned long long total = 0, sum = 0;
	for (;;) {
		void *buf = NULL;
		ssize_t n = pd_recv(acc, 1 << 20, &buf); /* a pointer into the receive ring: no copy */
		if (n == 0)
			break; /* the client closed and everything is consumed */
		if (n < 0) {
			if (errno != EAGAIN)
				return die("pd_recv");
			if (pd_epoll_wait(ep, out, 2, -1) < 0)
				return die("pd_epoll_wait");
			continue;
		}
		for (ssize_t i = 0; i < n; i++)
			sum += ((unsigned char *)buf)[i];
		total += n;
		pd_recv_done(acc, n); /* give the ring space back */
	}
	printf("received %llu bytes from %s:%d, byte sum %llu\n", total, inet_ntoa(cli.sin_addr), ntohs(cli.sin_port), sum);
	pd_close(acc);
	pd_close(sid);
	pd_release();
	return 0;
}
