/* The client half of the paper's Listing 1, as a runnable program:
 *   pd-example-client [ip] [port] [bytes] [message size]   (default 127.0.0.1 5201 1048576 65536)
 * sends bytes in messages from pd_malloc buffers, reusing each once pd_buf_refresh allows. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pd.h"

#define NBUF 4

static int die(const char *what)
{
	fprintf(stderr, "client: %s: %s\n", what, strerror(errno));
	return 1;
}

int main(int argc, char **argv)
{
	struct sockaddr_in serv = { .sin_family = AF_INET };
	inet_pton(AF_INET, argc > 1 ? argv[1] : "127.0.0.1", &serv.sin_addr);
	serv.sin_port = htons(argc > 2 ? atoi(argv[2]) : 5201);
	unsigned long long total = argc > 3 ? strtoull(argv[3], NULL, 0) : 1 << 20;
	size_t msg = argc > 4 ? strtoull(argv[4], NULL, 0) : 65536;

	if (pd_init(NULL, 0, 0) < 0)
		return die("pd_init (is `peregrine pd daemon` running?)");
	int sid = pd_socket(AF_INET, SOCK_STREAM, 0);
	if (sid < 0 || pd_connect(sid, (struct sockaddr *)&serv, sizeof serv) < 0)
		return die("socket/connect");

	int ep = pd_epoll_create(1);
	struct pd_epoll_event ev = { .events = PD_EPOLLOUT, .data.sid = sid }, out[1];
	pd_epoll_ctl(ep, PD_EPOLL_CTL_ADD, sid, &ev);

	void *bufs[NBUF];
	int nbuf = 0;
	unsigned long long sent = 0, sum = 0;
	while (sent < total) {
		size_t n = total - sent < msg ? total - sent : msg;
		/* a buffer we may overwrite: an old one that no send still reads, or a new one */
		void *buf = NULL;
		if (nbuf == NBUF) {
			if (pd_buf_refresh(sid, bufs, nbuf) > 0)
				buf = bufs[0];
			else
				pd_free(bufs[--nbuf]); /* still in flight (or, in direct mode, now the peer's): let it go */
		}
		if (!buf && (buf = pd_malloc(msg)) != NULL)
			bufs[nbuf++] = buf;
		if (!buf) {
			if (errno != ENOMEM && errno != EAGAIN)
				return die("pd_malloc"); /* e.g. ECONNRESET: the daemon is gone */
			if (pd_epoll_wait(ep, out, 1, 10) < 0)
				return die("pd_epoll_wait");
			continue;
		}
		for (size_t i = 0; i < n; i++) {
			((unsigned char *)buf)[i] = (unsigned char)(sent + i);
			sum += (unsigned char)(sent + i);
		}
		/* pd_send queues what fits and returns how much: loop until all of it is queued */
		size_t off = 0;
		while (off < n) {
			ssize_t k = pd_send(sid, (char *)buf + off, n - off);
			if (k < 0) {
				if (errno != EAGAIN)
					return die("pd_send");
				if (pd_epoll_wait(ep, out, 1, -1) < 0) /* the peer's ring has room again */
					return die("pd_epoll_wait");
				continue;
			}
			off += k;
		}
		sent += n;
	}
	printf("sent %llu bytes, byte sum %llu\n", sent, sum);
	for (int i = 0; i < nbuf; i++)
		pd_free(bufs[i]);
	pd_close(sid);
	pd_release();
	return 0;
}
