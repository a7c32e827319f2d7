/* libpd: the PipeDevice socket-like API (peregrine issue 14; the paper's Table 3).
 *
 * A process talks to the PipeDevice daemon (`peregrine pd daemon`) through a unix socket; the
 * daemon hands it only the memory of its own sockets. Data moves between per-connection rings:
 * zero-copy on both ends for the application (pd_send takes a pd_malloc buffer, pd_recv returns
 * a pointer into the receive ring). Every call is non-blocking except pd_epoll_wait.
 *
 * Errors: -1 (or NULL) and errno:
 *   EBADF  unknown sid / epfd          ENOTCONN  not connected, or pd_init not called
 *   EAGAIN nothing now (no pending connection, peer ring full, nothing received)
 *   ECONNREFUSED no listener            EADDRNOTAVAIL  address not in the caller's network namespace
 *   EADDRINUSE  address bound already   EPIPE  the peer closed (send)
 *   EFAULT buffer not from pd_malloc    EINVAL bad argument     ENOMEM  send ring full (pd_malloc)
 *   ECONNRESET the daemon is gone: every call made 1 ms or more after its end, and every call from
 *          then on, fails so (never EAGAIN or 0 forever), whatever its arguments. pd_close releases
 *          the socket all the same; pd_getsockopt(SO_ERROR) returns 0 with ECONNRESET as the value;
 *          pd_epoll_wait reports PD_EPOLLERR | PD_EPOLLHUP on every watched socket (-1/ECONNRESET
 *          when it watches none); pd_init says ECONNRESET until pd_release, after which it
 *          connects afresh. pd_free and pd_release (void) still free what they are given.
 *   ETIMEDOUT  the daemon did not answer a control call within 5 s (the library is dead from then on)
 *   EMFILE / ENOBUFS  the daemon's per-process or per-namespace limits (sockets; shared memory)
 *
 * Environment: PD_SOCKET (daemon socket), PD_RING_SIZE (receive ring bytes per socket),
 * PD_POOL_SIZE (send ring bytes per process); both sizes are powers of two.
 */
#ifndef PEREGRINE_PD_H
#define PEREGRINE_PD_H

#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PD_DEFAULT_SOCKET "/run/peregrine/pd/pd.sock" /* a directory of its own: mount it read-only into containers */

int     pd_init(const char *chardev, int sqthresh, int cqthresh); /* chardev: daemon socket; NULL = $PD_SOCKET, else the default; 0 = default depths */
void    pd_release(void);
int     pd_socket(int domain, int type, int protocol);            /* AF_INET, SOCK_STREAM -> sid >= 0 */
int     pd_bind(int sid, const struct sockaddr *addr, socklen_t addrlen);   /* a struct sockaddr_in */
int     pd_listen(int sid, int backlog);
int     pd_accept(int sid, struct sockaddr *addr, socklen_t *addrlen);     /* new sid; -1/EAGAIN if none pending */
int     pd_connect(int sid, const struct sockaddr *addr, socklen_t addrlen); /* 0; -1/ECONNREFUSED if no listener */
ssize_t pd_send(int sid, const void *buf, size_t len);   /* buf inside a pd_malloc buffer; bytes queued (see the notes) */
int     pd_buf_refresh(int sid, void **ptrs, int ptrlen); /* how many of ptrs[] may be rewritten now; those are moved to the front */
ssize_t pd_recv(int sid, size_t buflen, void **recvbuf); /* >0: that many bytes (<= buflen, contiguous) at *recvbuf; 0: peer closed and all consumed; -1/EAGAIN */
int     pd_recv_done(int sid, size_t len);               /* releases len bytes from the front; pd_recv returns the same bytes until then */
int     pd_close(int sid);
void   *pd_malloc(size_t size);
void    pd_free(void *buf);
int     pd_getsockopt(int sid, int level, int optname, void *optval, socklen_t *optlen);
int     pd_setsockopt(int sid, int level, int optname, const void *optval, socklen_t optlen);

struct pd_epoll_event { uint32_t events; union { void *ptr; int sid; uint64_t u64; } data; };

#define PD_EPOLLIN  0x001u /* data to pd_recv, end of stream, or (listening) a connection to pd_accept */
#define PD_EPOLLOUT 0x004u /* the peer's ring has room (pd_send queues something) */
#define PD_EPOLLERR 0x008u /* an asynchronous error; pd_getsockopt(SOL_SOCKET, SO_ERROR) says which */
#define PD_EPOLLHUP 0x010u /* the peer closed */

#define PD_EPOLL_CTL_ADD 1
#define PD_EPOLL_CTL_DEL 2
#define PD_EPOLL_CTL_MOD 3

int     pd_epoll_create(int size);
int     pd_epoll_ctl(int epfd, int op, int sid, struct pd_epoll_event *ev);
int     pd_epoll_wait(int epfd, struct pd_epoll_event *events, int maxevents, int timeout_ms);

/* Notes.
 * - pd_malloc takes no sid. In engine mode (the default) buffers come from the process's send
 *   ring and may be sent on any socket. In direct mode (daemon --mode direct) they are carved from
 *   the receive ring of the peer of the socket this thread last connected, accepted or sent on,
 *   so the data is written in place and pd_send only publishes it: send such buffers in the order
 *   pd_malloc returned them; once sent they belong to the peer (pd_buf_refresh never returns them).
 *   There pd_malloc fails with EAGAIN while the peer's ring lacks room (always, for a size above
 *   the ring: SO_RCVBUF; send such messages in pieces) and with EPIPE once the peer closed.
 * - Engine mode: the send ring is first fit, so a buffer kept and reused (pd_buf_refresh) does
 *   not hold up the rest; ENOMEM means no free block of that size now.
 * - pd_send has stream semantics, like send(2) on a non-blocking socket: it queues what fits now
 *   (1..len bytes, from the front of buf) and returns how many; the caller sends the rest later
 *   (wait for PD_EPOLLOUT). -1/EAGAIN: nothing fits now, nothing was queued.
 * - Events are level-triggered. pd_epoll_create's size is a hint only.
 * - Options: SOL_SOCKET SO_RCVBUF/SO_SNDBUF (ring sizes, read-only: set PD_RING_SIZE/PD_POOL_SIZE
 *   before pd_init), SO_ERROR (read and clear), SO_TYPE.
 */

#ifdef __cplusplus
}
#endif
#endif
