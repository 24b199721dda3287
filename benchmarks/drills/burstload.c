/* burstload: N HTTP/1.1 requests at once, each on its own TCP connection, as N
 * independent clients would send them; one line per answer, written as it arrives.
 *
 *   burstload HOST PORT TIMEOUT_S < targets
 *
 * stdin: one target actor per line ("atespace/name"); request i goes to line i.
 * stdout, one line per request, in the order they end:
 *   i <TAB> started_s <TAB> seconds <TAB> status <TAB> first line of the body
 * started_s is when connect() was called, relative to the first one; seconds runs from
 * there to the last byte of the answer (Content-Length) or the peer's close. status 0 is
 * no answer: a failed connect, a reset, or TIMEOUT_S passed (the body says which).
 *
 * Why C: the drill measures what 2,800 clients see. One Python event loop driving
 * 2,800 connections spends seconds of its own CPU connecting and parsing, which lands
 * in every latency it records and takes a core from the stack under test. This client
 * needs a few milliseconds of CPU for the whole burst, and its clock starts at connect().
 * Loopback only: HOST must be a numeric IPv4 address.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF 8192

struct req {
    char actor[512];
    int fd;
    double start;
    double end;
    size_t len;
    int sent;
    int done;
    char buf[BUF];
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double t0;

static void report(struct req *r, int i, int status, const char *body) {
    char line[160];
    size_t n = 0;
    while (body[n] && body[n] != '\n' && body[n] != '\r' && n < sizeof(line) - 1) {
        line[n] = body[n] == '\t' ? ' ' : body[n];
        n++;
    }
    line[n] = 0;
    printf("%d\t%.6f\t%.6f\t%d\t%s\n", i, r->start - t0, r->end - r->start, status, line);
    fflush(stdout);
    r->done = 1;
}

/* Whether the answer in r->buf is complete; sets *status and *body when it is. */
static int complete(struct req *r, int eof, int *status, const char **body) {
    r->buf[r->len] = 0;
    char *head_end = strstr(r->buf, "\r\n\r\n");
    if (!head_end)
        return 0;
    if (strncmp(r->buf, "HTTP/1.", 7) != 0 || r->len < 12)
        return 0;
    *status = atoi(r->buf + 9);
    *body = head_end + 4;
    long want = -1;
    for (char *p = r->buf; p < head_end; p++) {
        if ((p == r->buf || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0) {
            want = strtol(p + 15, NULL, 10);
            break;
        }
    }
    size_t have = r->len - (size_t)(head_end + 4 - r->buf);
    if (want >= 0 && (long)have >= want)
        return 1;
    if (r->len >= BUF - 1)
        return 1; /* enough of the body for the report */
    return eof;
}

static void finish(int ep, struct req *r) {
    epoll_ctl(ep, EPOLL_CTL_DEL, r->fd, NULL);
    close(r->fd);
    r->fd = -1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s HOST PORT TIMEOUT_S < targets\n", argv[0]);
        return 2;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1) {
        fprintf(stderr, "burstload: HOST must be a numeric IPv4 address, got %s\n", argv[1]);
        return 2;
    }
    double timeout = atof(argv[3]);
    size_t cap = 1024, n = 0;
    struct req *reqs = calloc(cap, sizeof *reqs);
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0])
            continue;
        if (n == cap) {
            cap *= 2;
            reqs = realloc(reqs, cap * sizeof *reqs);
            memset(reqs + n, 0, (cap - n) * sizeof *reqs);
        }
        snprintf(reqs[n].actor, sizeof reqs[n].actor, "%s", line);
        n++;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < n + 64) {
        rl.rlim_cur = rl.rlim_max < n + 64 ? rl.rlim_max : n + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    int ep = epoll_create1(0);
    if (ep < 0) {
        perror("burstload: epoll_create1");
        return 1;
    }
    t0 = now();
    size_t open_count = 0;
    for (size_t i = 0; i < n; i++) {
        struct req *r = &reqs[i];
        r->start = now();
        r->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (r->fd < 0) {
            r->end = now();
            report(r, (int)i, 0, strerror(errno));
            continue;
        }
        int one = 1;
        setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(r->fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS) {
            r->end = now();
            report(r, (int)i, 0, strerror(errno));
            close(r->fd);
            r->fd = -1;
            continue;
        }
        struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = i};
        epoll_ctl(ep, EPOLL_CTL_ADD, r->fd, &ev);
        open_count++;
    }
    struct epoll_event events[256];
    while (open_count > 0) {
        double left = t0 + timeout - now();
        int k = epoll_wait(ep, events, 256, left > 0 ? (int)(left * 1000) + 1 : 0);
        if (k < 0 && errno != EINTR) {
            perror("burstload: epoll_wait");
            return 1;
        }
        for (int e = 0; e < k; e++) {
            size_t i = events[e].data.u64;
            struct req *r = &reqs[i];
            if (r->fd < 0)
                continue;
            if (!r->sent) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(r->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) {
                    r->end = now();
                    report(r, (int)i, 0, strerror(err));
                    finish(ep, r);
                    open_count--;
                    continue;
                }
                char out[512];
                int m = snprintf(out, sizeof out,
                                 "GET / HTTP/1.1\r\nHost: %s:%s\r\nate-target-actor: %s\r\n"
                                 "Content-Length: 0\r\nConnection: close\r\n\r\n",
                                 argv[1], argv[2], r->actor);
                if (write(r->fd, out, (size_t)m) != m) {
                    r->end = now();
                    report(r, (int)i, 0, "short write");
                    finish(ep, r);
                    open_count--;
                    continue;
                }
                r->sent = 1;
                struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = i};
                epoll_ctl(ep, EPOLL_CTL_MOD, r->fd, &ev);
                continue;
            }
            ssize_t got = read(r->fd, r->buf + r->len, BUF - 1 - r->len);
            int eof = got == 0;
            if (got < 0) {
                if (errno == EAGAIN)
                    continue;
                r->end = now();
                report(r, (int)i, 0, strerror(errno));
                finish(ep, r);
                open_count--;
                continue;
            }
            r->len += (size_t)got;
            int status = 0;
            const char *body = "";
            if (complete(r, eof, &status, &body)) {
                r->end = now();
                report(r, (int)i, status, body);
                finish(ep, r);
                open_count--;
            } else if (eof) {
                r->end = now();
                report(r, (int)i, 0, "closed before a complete answer");
                finish(ep, r);
                open_count--;
            }
        }
        if (now() >= t0 + timeout) {
            for (size_t i = 0; i < n; i++) {
                struct req *r = &reqs[i];
                if (r->fd >= 0 && !r->done) {
                    r->end = now();
                    report(r, (int)i, 0, "no answer within the client limit");
                    finish(ep, r);
                    open_count--;
                }
            }
        }
    }
    return 0;
}
