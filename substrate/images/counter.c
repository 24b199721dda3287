/* counter: the small HTTP/1.1 workload of substrate's sandbox conformance suite.
 *
 *   GET /        adds one to an in-memory counter: "count=<n> boot=<token>"; with env
 *                STATE_DIR set it also adds one to the counter kept in the file
 *                $STATE_DIR/count and answers "count=<n> boot=<token> disk=<m>"
 *                (disk=error if the file cannot be written)
 *   GET /readyz  "ok"
 *   GET /whoami  "<atespace>/<name> <uid>" from /run/ate/{atespace,name,uid} (404 if absent)
 *   GET /fill    "filled=<MiB>": how much of FILL_MIB is allocated and touched so far
 * Other paths 404, other methods 405, malformed requests 400 (then close).
 *
 * <token> is 16 hex digits picked at start. Ports: every "--port N" (or "-p N",
 * "--port=N"), else env PORTS ("80,8080"), else 80. Connections are keep-alive until the
 * client closes; after HTTP/1.0 or "Connection: close" the server closes once it answered.
 * FILL_MIB=N allocates N MiB after listening and fills it with pseudo-random bytes (seeded
 * by the token), 1 MiB per loop turn, so the server answers while it fills.
 * STATE_DIR (created if missing) is any directory; in a substrate sandbox /tmp is a tmpfs,
 * so a file there is part of the memory snapshot.
 * One thread, one poll() loop. Build: gcc -static -O2 -Wall -Wextra -o counter counter.c
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAXLISTEN 16
#define MAXCONN 128
#define INBUF 8192
#define OUTBUF 2048
#define MIB (1024L * 1024L)

struct conn {
  int fd;             /* -1: free slot */
  int closing;        /* close once the output is flushed */
  int eof;            /* the client closed its side */
  size_t inlen, outlen, outoff;
  long long skip;     /* request body bytes still to discard */
  char in[INBUF], out[OUTBUF];
};

static struct conn conns[MAXCONN];
static int lfds[MAXLISTEN], nlisten;
static unsigned long long counter;
static char token[17];
static uint64_t rng;
static unsigned char *fill;
static long fill_target, fill_done; /* MiB */
static char count_path[512], count_tmp[520]; /* "" unless STATE_DIR is set */

static uint64_t next_random(void) { /* splitmix64 */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static void add_port(const char *s) {
  char *end;
  long p = strtol(s, &end, 10);
  if (end == s || *end || p < 1 || p > 65535 || nlisten == MAXLISTEN) {
    fprintf(stderr, "counter: bad or too many ports: %s\n", s);
    exit(2);
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p),
                          .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 128)) {
    fprintf(stderr, "counter: port %ld: %s\n", p, strerror(errno));
    exit(1);
  }
  lfds[nlisten++] = fd;
}

static int read_small(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n < 0) return -1;
  while (n > 0 && isspace((unsigned char)buf[n - 1])) n--;
  buf[n] = 0;
  return 0;
}

/* mkdir -p of STATE_DIR and the paths of its counter file; exits on a bad value. */
static void setup_state_dir(const char *dir) {
  char path[sizeof count_path];
  size_t len = strlen(dir);
  if (!len || len >= sizeof path - 8) {
    fprintf(stderr, "counter: STATE_DIR must be a path shorter than %zu bytes\n", sizeof path - 8);
    exit(2);
  }
  memcpy(path, dir, len + 1);
  for (char *p = path + 1;; p++) {
    if (*p == '/' || !*p) {
      char saved = *p;
      *p = 0;
      if (mkdir(path, 0755) && errno != EEXIST) {
        fprintf(stderr, "counter: STATE_DIR %s: %s\n", path, strerror(errno));
        exit(1);
      }
      *p = saved;
      if (!saved) break;
    }
  }
  snprintf(count_path, sizeof count_path, "%s/count", dir);
  snprintf(count_tmp, sizeof count_tmp, "%s/count.tmp", dir);
}

/* Add one to the counter in STATE_DIR/count (written whole, then renamed); -1 on failure. */
static long long disk_step(void) {
  char buf[64];
  long long n = 0;
  if (!read_small(count_path, buf, sizeof buf)) n = strtoll(buf, NULL, 10);
  if (n < 0) n = 0;
  n++;
  int len = snprintf(buf, sizeof buf, "%lld\n", n);
  int fd = open(count_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  ssize_t w = write(fd, buf, (size_t)len);
  if (close(fd) || w != len || rename(count_tmp, count_path)) return -1;
  return n;
}

static void respond(struct conn *c, int status, const char *body) {
  const char *reason = status == 200 ? "OK" : status == 400 ? "Bad Request"
                     : status == 404 ? "Not Found" : "Method Not Allowed";
  int n = snprintf(c->out, OUTBUF,
                   "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n%s%s\r\n%s",
                   status, reason, strlen(body), status == 405 ? "Allow: GET\r\n" : "",
                   c->closing ? "Connection: close\r\n" : "", body);
  c->outlen = n < 0 ? 0 : (size_t)n < OUTBUF ? (size_t)n : OUTBUF - 1;
  c->outoff = 0;
}

static void route(struct conn *c, const char *method, const char *target) {
  char body[1024], ns[256], name[256], uid[256];
  size_t plen = strcspn(target, "?#");
  if (strcmp(method, "GET") != 0) {
    respond(c, 405, "method not allowed");
  } else if (plen == 1) {
    int n = snprintf(body, sizeof body, "count=%llu boot=%s", ++counter, token);
    if (count_path[0]) {
      long long disk = disk_step();
      if (disk < 0) snprintf(body + n, sizeof body - (size_t)n, " disk=error");
      else snprintf(body + n, sizeof body - (size_t)n, " disk=%lld", disk);
    }
    respond(c, 200, body);
  } else if (plen == 7 && !strncmp(target, "/readyz", 7)) {
    respond(c, 200, "ok");
  } else if (plen == 5 && !strncmp(target, "/fill", 5)) {
    snprintf(body, sizeof body, "filled=%ld", fill_done);
    respond(c, 200, body);
  } else if (plen == 7 && !strncmp(target, "/whoami", 7) &&
             !read_small("/run/ate/atespace", ns, sizeof ns) &&
             !read_small("/run/ate/name", name, sizeof name) &&
             !read_small("/run/ate/uid", uid, sizeof uid)) {
    snprintf(body, sizeof body, "%s/%s %s", ns, name, uid);
    respond(c, 200, body);
  } else {
    respond(c, 404, "not found");
  }
}

static void consume(struct conn *c, size_t n) {
  memmove(c->in, c->in + n, c->inlen - n);
  c->inlen -= n;
}

/* Parse one complete request head at c->in (NUL-terminated at its blank line) and answer. */
static void request(struct conn *c, char *head) {
  char *line = head, *eol = strstr(line, "\r\n"), *sp1, *sp2;
  if (eol) *eol = 0;
  sp1 = strchr(line, ' ');
  sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
  if (!sp1 || !sp2 || sp1 == line || sp1[1] != '/' || strchr(sp2 + 1, ' ')) goto bad;
  *sp1 = *sp2 = 0;
  for (char *m = line; *m; m++)
    if (*m < 'A' || *m > 'Z') goto bad;
  if (!strcmp(sp2 + 1, "HTTP/1.0")) c->closing = 1;
  else if (strcmp(sp2 + 1, "HTTP/1.1")) goto bad;
  while (eol) { /* headers */
    char *h = eol + 2, *colon, *v;
    eol = strstr(h, "\r\n");
    if (eol) *eol = 0;
    if (!(colon = strchr(h, ':')) || colon == h) goto bad;
    *colon = 0;
    for (v = colon + 1; *v == ' ' || *v == '\t'; v++) {}
    if (!strcasecmp(h, "connection") && strcasestr(v, "close")) {
      c->closing = 1;
    } else if (!strcasecmp(h, "content-length")) {
      char *end;
      errno = 0;
      c->skip = strtoll(v, &end, 10);
      if (end == v || errno || c->skip < 0 || (*end && *end != ' ')) goto bad;
    } else if (!strcasecmp(h, "transfer-encoding")) {
      goto bad; /* no request bodies here beyond Content-Length */
    }
  }
  route(c, line, sp1 + 1);
  return;
bad:
  c->closing = 1;
  c->skip = 0;
  respond(c, 400, "bad request");
}

/* Answer what is buffered, one request at a time (pipelined ones after the flush). */
static void process(struct conn *c) {
  while (!c->closing && c->outlen == 0) {
    if (c->skip > 0) {
      size_t n = (unsigned long long)c->skip < c->inlen ? (size_t)c->skip : c->inlen;
      consume(c, n);
      c->skip -= (long long)n;
      if (c->skip > 0) break;
      continue;
    }
    if (c->inlen >= 2 && c->in[0] == '\r' && c->in[1] == '\n') { /* stray blank line */
      consume(c, 2);
      continue;
    }
    char *end = memmem(c->in, c->inlen, "\r\n\r\n", 4);
    if (!end) {
      if (c->inlen == INBUF || memchr(c->in, 0, c->inlen)) {
        c->closing = 1;
        respond(c, 400, "bad request");
      }
      break;
    }
    size_t hlen = (size_t)(end - c->in) + 4;
    if (memchr(c->in, 0, hlen)) {
      c->closing = 1;
      respond(c, 400, "bad request");
      break;
    }
    *end = 0;
    request(c, c->in);
    consume(c, hlen);
  }
  if (c->eof && c->outlen == 0) c->closing = 1;
}

static void drop(struct conn *c) {
  close(c->fd);
  c->fd = -1;
}

static void flush(struct conn *c) {
  for (;;) {
    while (c->outoff < c->outlen) {
      ssize_t n = send(c->fd, c->out + c->outoff, c->outlen - c->outoff, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return; /* wait for POLLOUT */
      if (n <= 0) { drop(c); return; }
      c->outoff += (size_t)n;
    }
    c->outlen = c->outoff = 0;
    if (c->closing) { drop(c); return; }
    process(c); /* the next pipelined request, if any */
    if (!c->outlen) {
      if (c->closing) drop(c);
      return;
    }
  }
}

static void accept_all(int lfd) {
  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), i;
    if (fd < 0) return;
    for (i = 0; i < MAXCONN && conns[i].fd >= 0; i++) {}
    if (i == MAXCONN) { /* full: reset it (no TIME_WAIT left behind) */
      struct linger l = {1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      close(fd);
      continue;
    }
    memset(&conns[i], 0, offsetof(struct conn, in));
    conns[i].fd = fd;
  }
}

static void receive(struct conn *c) {
  if (c->inlen < INBUF) {
    ssize_t n = recv(c->fd, c->in + c->inlen, INBUF - c->inlen, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n < 0) { drop(c); return; } /* reset by the client */
    if (n == 0) c->eof = 1;
    c->inlen += (size_t)n;
  }
  process(c);
  if (c->outlen) flush(c);
  else if (c->closing) drop(c);
}

static void fill_step(void) {
  uint64_t *p = (uint64_t *)(fill + fill_done * MIB);
  for (size_t i = 0; i < MIB / sizeof *p; i++) p[i] = next_random();
  fill_done++;
}

int main(int argc, char **argv) {
  uint64_t seed = 0;
  struct pollfd pfd[MAXLISTEN + MAXCONN];
  int who[MAXLISTEN + MAXCONN];
  signal(SIGPIPE, SIG_IGN);
  if (getrandom(&seed, sizeof seed, 0) != sizeof seed || !seed)
    seed = (uint64_t)time(NULL) * UINT64_C(6364136223846793005) ^ (uint64_t)getpid();
  snprintf(token, sizeof token, "%016llx", (unsigned long long)seed);
  rng = seed;
  for (int i = 1; i < argc; i++) {
    if ((!strcmp(argv[i], "--port") || !strcmp(argv[i], "-p")) && i + 1 < argc) add_port(argv[++i]);
    else if (!strncmp(argv[i], "--port=", 7)) add_port(argv[i] + 7);
    else { fprintf(stderr, "usage: counter [--port N]...\n"); return 2; }
  }
  if (!nlisten && getenv("PORTS")) {
    char ports[256], *save = NULL;
    snprintf(ports, sizeof ports, "%s", getenv("PORTS"));
    for (char *p = strtok_r(ports, ", ", &save); p; p = strtok_r(NULL, ", ", &save)) add_port(p);
  }
  if (!nlisten) add_port("80");
  for (int i = 0; i < MAXCONN; i++) conns[i].fd = -1;
  if (getenv("STATE_DIR")) setup_state_dir(getenv("STATE_DIR"));
  fill_target = getenv("FILL_MIB") ? atol(getenv("FILL_MIB")) : 0;
  if (fill_target > 0 && !(fill = malloc((size_t)fill_target * MIB))) {
    fprintf(stderr, "counter: cannot allocate %ld MiB\n", fill_target);
    fill_target = 0;
  }
  fprintf(stderr, "counter: serving on %d port(s), boot=%s\n", nlisten, token);
  for (;;) {
    int n = 0;
    for (int i = 0; i < nlisten; i++, n++) {
      pfd[n] = (struct pollfd){.fd = lfds[i], .events = POLLIN};
      who[n] = -1;
    }
    for (int i = 0; i < MAXCONN; i++) {
      struct conn *c = &conns[i];
      if (c->fd < 0) continue;
      short ev = c->outlen ? POLLOUT : (c->inlen < INBUF && !c->eof) ? POLLIN : 0;
      pfd[n] = (struct pollfd){.fd = c->fd, .events = ev};
      who[n++] = i;
    }
    int filling = fill_done < fill_target;
    if (poll(pfd, (nfds_t)n, filling ? 0 : -1) < 0 && errno != EINTR) {
      perror("counter: poll");
      return 1;
    }
    for (int k = 0; k < n; k++) {
      if (!pfd[k].revents) continue;
      if (who[k] < 0) { accept_all(pfd[k].fd); continue; }
      struct conn *c = &conns[who[k]];
      if (c->fd != pfd[k].fd) continue;
      if (c->outlen) flush(c);
      else receive(c);
    }
    if (filling) fill_step();
  }
}
