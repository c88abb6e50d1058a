/* hetkv serve, the HTTP side (serve.h): libmicrohttpd in thread-per-
 * connection mode, routing, the bearer-token check, request bodies under a
 * size limit, and responses: whole JSON bodies or server-sent events.
 *
 * Thread per connection because a connection thread may block: it waits on
 * its request's condition variable for the engine thread's next text, in
 * the access handler (a whole response) or in the content reader (a stream),
 * and while it waits it polls its socket, so a client that goes away is
 * seen within WAIT_MS and its sequence cancelled at the engine's next step. */
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

enum { WAIT_MS = 100 };

/* One HTTP request (libmicrohttpd's per-request context). */
typedef struct conn {
    hkv_srv *s;
    struct MHD_Connection *c;
    char *body;
    size_t len, cap;
    int too_large;
    hkv_srv_req *r;           /* handed to the engine */
    /* streaming */
    char *ev;                 /* the event being sent */
    size_t ev_len, ev_off;
    size_t sent;              /* bytes of r->out made into events */
    int phase;                /* 0: nothing sent, 1: streaming, 2: [DONE] sent */
} conn;

static void wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

/* The peer closed or reset its side: nobody will read the answer. */
static int client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static enum MHD_Result send_text(conn *k, int status, char *text, const char *type,
                                 const char *retry_after) {
    if (!text) {
        status = 500;
        text = strdup("{\"error\":{\"message\":\"no memory\",\"type\":\"server_error\"}}");
        type = "application/json";
    }
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(text ? strlen(text) : 0, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (retry_after) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ok = MHD_queue_response(k->c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    pthread_mutex_lock(&k->s->mu);
    hkv_srv_count(k->s, status);
    pthread_mutex_unlock(&k->s->mu);
    return ok;
}

static enum MHD_Result send_error(conn *k, int status, const char *msg, const char *code,
                                  const char *retry_after) {
    return send_text(k, status, hkv_srv_error_json(status, msg, code), "application/json",
                     retry_after);
}

/* "Authorization: Bearer KEY", compared in time that depends only on the
 * key's length, not on where a guess first differs. */
static int authorized(const hkv_srv *s, struct MHD_Connection *c) {
    const char *key = s->o->api_key;
    if (!key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7)) return 0;
    h += 7;
    size_t n = strlen(key), m = strlen(h);
    unsigned diff = n != m;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)key[i] ^ (unsigned char)(i < m ? h[i] : 0);
    return diff == 0;
}

/* Next bytes of a stream: the pending event, else the next one built from
 * the request's new text or its end. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn *k = cls;
    hkv_srv *s = k->s;
    hkv_srv_req *r = k->r;
    while (k->ev_off == k->ev_len) {
        free(k->ev);
        k->ev = NULL;
        k->ev_len = k->ev_off = 0;
        if (k->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        if (k->phase == 0 && r->it.chat) {   /* the role comes first, as OpenAI sends it */
            k->ev = hkv_srv_sse_chunk(s, r, NULL, 0, 1, 0, 0);
            k->phase = 1;
        } else {
            k->phase = 1;
            pthread_mutex_lock(&s->mu);
            while (!r->done && k->sent == r->out_len) {
                wait_ms(&r->cv, &s->mu, WAIT_MS);
                if (!r->done && k->sent == r->out_len && client_gone(k->c)) {
                    pthread_mutex_unlock(&s->mu);
                    return MHD_CONTENT_READER_END_WITH_ERROR;   /* the completion cancels */
                }
            }
            char *delta = NULL;
            size_t n = r->out_len - k->sent;
            if (n && (delta = malloc(n))) memcpy(delta, r->out + k->sent, n);
            k->sent = r->out_len;
            int done = r->done, status = r->http_status;
            pthread_mutex_unlock(&s->mu);
            if (n) {
                k->ev = delta ? hkv_srv_sse_chunk(s, r, delta, n, 0, 0, 0) : NULL;
                free(delta);
            } else if (done) {   /* r is final: read without the lock */
                char *a = status == 200 ? hkv_srv_sse_chunk(s, r, NULL, 0, 0, 0, 0)
                                        : hkv_srv_error_json(status, r->err.msg, NULL);
                char *u = status == 200 && r->include_usage ? hkv_srv_sse_chunk(s, r, NULL, 0, 0, 1, 0)
                                                            : NULL;
                size_t la = a ? strlen(a) : 0, lu = u ? strlen(u) : 0;
                if (a && (k->ev = malloc(la + lu + 32))) {
                    snprintf(k->ev, la + lu + 32, "%s%s%s%sdata: [DONE]\n\n",
                             status == 200 ? "" : "data: ", a, status == 200 ? "" : "\n\n",
                             u ? u : "");
                }
                free(a);
                free(u);
                k->phase = 2;
            }
        }
        if (!k->ev && k->phase != 2) return MHD_CONTENT_READER_END_WITH_ERROR;   /* no memory */
        if (k->ev) k->ev_len = strlen(k->ev);
    }
    size_t n = k->ev_len - k->ev_off < max ? k->ev_len - k->ev_off : max;
    memcpy(buf, k->ev + k->ev_off, n);
    k->ev_off += n;
    return (ssize_t)n;
}

/* r never reached the engine: free it and answer with an error. */
static enum MHD_Result drop(conn *k, hkv_srv_req *r, int status, const char *msg,
                            const char *code, const char *retry_after) {
    pthread_mutex_lock(&k->s->mu);
    hkv_srv_release(k->s, r, 0);
    pthread_mutex_unlock(&k->s->mu);
    return send_error(k, status, msg, code, retry_after);
}

/* A completion request: parse it, queue it, then answer whole or stream. */
static enum MHD_Result complete(conn *k, int chat) {
    hkv_srv *s = k->s;
    hkv_srv_req *r = calloc(1, sizeof *r);
    if (!r) return send_error(k, 500, "no memory for the request", NULL, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->eng_gone = 1;   /* the engine holds it only once queued */
    r->created = (long long)time(NULL);
    pthread_mutex_lock(&s->mu);
    r->it.line = ++s->next_id;
    s->n_live++;
    pthread_mutex_unlock(&s->mu);
    hkv_err err;
    hkv_err_clear(&err);
    if (hkv_srv_parse(s, k->body ? k->body : "", k->len, chat, r, &err))
        return drop(k, r, err.code == HKV_E_NOMEM ? 500 : 400, err.msg, NULL, NULL);
    const hkv_sched_req *q = &r->it.req;
    if (q->n_prompt + q->n_predict > s->e->p.n_ctx) {   /* the scheduler would refuse it too */
        char msg[160];
        snprintf(msg, sizeof msg, "the request needs %lld tokens of context (prompt %lld + "
                 "max_tokens %d) but the context is %lld", (long long)(q->n_prompt + q->n_predict),
                 (long long)q->n_prompt, q->n_predict, (long long)s->e->p.n_ctx);
        return drop(k, r, 400, msg, "context_length_exceeded", NULL);
    }
    pthread_mutex_lock(&s->mu);
    const char *refuse = s->stopping ? "the server is shutting down" :
                         s->n_open >= s->o->sc.max_batch + s->o->max_queue ?
                         "the server is busy: every slot and the queue are taken" : NULL;
    if (refuse) {
        if (!s->stopping) s->m.refused_queue++;
        pthread_mutex_unlock(&s->mu);
        return drop(k, r, 503, refuse, "server_busy", "1");
    }
    k->r = r;
    hkv_srv_enqueue(s, r);
    /* a whole answer waits for the end; a stream for the first text, so a
     * request the scheduler refuses still gets its 400 */
    while (!r->done && (!r->stream || !r->out_len)) {
        wait_ms(&r->cv, &s->mu, WAIT_MS);
        if (!r->done && client_gone(k->c)) {
            pthread_mutex_unlock(&s->mu);
            return MHD_NO;   /* the completion callback cancels it */
        }
    }
    int status = r->done ? r->http_status : 200;
    pthread_mutex_unlock(&s->mu);
    if (status != 200)
        return send_error(k, status, r->err.msg, NULL, status == 503 ? "1" : NULL);
    if (!r->stream) return send_text(k, 200, hkv_srv_completion_json(s, r), "application/json", NULL);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                                  stream_read, k, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(k->c, 200, resp);
    MHD_destroy_response(resp);
    pthread_mutex_lock(&s->mu);
    hkv_srv_count(s, 200);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **req_cls) {
    (void)version;
    hkv_srv *s = cls;
    conn *k = *req_cls;
    const int post = !strcmp(method, "POST");
    if (!k) {   /* headers only: set up, and refuse a declared body far past the limit */
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        k->s = s;
        k->c = c;
        *req_cls = k;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (post && cl && strtoull(cl, NULL, 10) > 16 * (unsigned long long)s->o->max_body)
            return send_error(k, 413, "the request body is past the limit (--max-body)",
                              "body_too_large", NULL);
        return MHD_YES;   /* answered at the next call: one on the first closes keep-alive */
    }
    if (*upload_size) {   /* a body piece: kept up to the limit, the rest read and dropped */
        size_t n = *upload_size;
        *upload_size = 0;
        if (k->too_large || k->len + n > (size_t)s->o->max_body) {
            k->too_large = 1;
            return MHD_YES;
        }
        if (k->len + n + 1 > k->cap) {
            size_t nc = 2 * (k->len + n) + 1024;
            char *nb = realloc(k->body, nc);
            if (!nb) return MHD_NO;
            k->body = nb;
            k->cap = nc;
        }
        memcpy(k->body + k->len, upload, n);
        k->len += n;
        return MHD_YES;
    }
    if (!strcmp(url, "/health")) {
        if (strcmp(method, "GET")) return send_error(k, 405, "GET /health", NULL, NULL);
        pthread_mutex_lock(&s->mu);
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        return send_text(k, stopping ? 503 : 200, strdup(stopping ? "{\"status\":\"shutting down\"}"
                                                                  : "{\"status\":\"ok\"}"),
                         "application/json", NULL);
    }
    const int chat = !strcmp(url, "/v1/chat/completions");
    const int cmpl = !strcmp(url, "/v1/completions");
    const int models = !strcmp(url, "/v1/models"), metrics = !strcmp(url, "/metrics");
    if (!chat && !cmpl && !models && !metrics)
        return send_error(k, 404, "no such endpoint", "not_found", NULL);
    if ((chat || cmpl) != post)
        return send_error(k, 405, chat || cmpl ? "use POST" : "use GET", NULL, NULL);
    if (!authorized(s, c))
        return send_error(k, 401, "missing or wrong API key (Authorization: Bearer KEY)",
                          "invalid_api_key", NULL);
    if (models) return send_text(k, 200, hkv_srv_models_json(s), "application/json", NULL);
    if (metrics)
        return send_text(k, 200, hkv_srv_metrics_text(s), "text/plain; version=0.0.4", NULL);
    if (k->too_large)
        return send_error(k, 413, "the request body is past the limit (--max-body)",
                          "body_too_large", NULL);
    return complete(k, chat);
}

/* Every request ends here, answered or not: a request still running loses
 * its client and is cancelled; the connection's hold on it is released. */
static void completed(void *cls, struct MHD_Connection *c, void **req_cls,
                      enum MHD_RequestTerminationCode why) {
    (void)c;
    (void)why;
    hkv_srv *s = cls;
    conn *k = *req_cls;
    if (!k) return;
    if (k->r) {
        pthread_mutex_lock(&s->mu);
        if (!k->r->done) {
            k->r->cancel = 1;
            s->m.cancelled++;
            pthread_cond_signal(&s->engine_cv);
        }
        hkv_srv_release(s, k->r, 0);
        pthread_mutex_unlock(&s->mu);
    }
    free(k->ev);
    free(k->body);
    free(k);
    *req_cls = NULL;
}

/* libmicrohttpd's messages, prefixed; not the ones it prints for each
 * connection hetkv closes because its client went away (a cancel, counted
 * in the metrics). */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* ours (a stream we end on purpose) or a client that went away, which the
     * metrics count as a cancel: not errors of the server */
    if (strstr(msg, "Application reported internal error") ||
        strstr(msg, "application error generating response") ||
        strstr(msg, "no longer available") || strstr(msg, "Connection reset") ||
        strstr(msg, "Broken pipe"))
        return;
    fprintf(stderr, "hetkv serve: http: %s%s", msg, strchr(msg, '\n') ? "" : "\n");
}

int hkv_srv_http_start(hkv_srv *s, int *bound, hkv_err *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *ai = NULL;
    int g = getaddrinfo(s->o->host, NULL, &hints, &ai);
    if (g) return hkv_seterr(err, HKV_E_INVAL, "--host %s: %s", s->o->host, gai_strerror(g));
    struct sockaddr_storage sa;
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
    const int v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (v6) ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)s->o->port);
    else ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)s->o->port);
    const struct in6_addr *a6 = &((struct sockaddr_in6 *)&sa)->sin6_addr;
    const int loopback = v6 ? IN6_IS_ADDR_LOOPBACK(a6) ||
                                  (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127)
                            : ntohl(((struct sockaddr_in *)&sa)->sin_addr.s_addr) >> 24 == 127;
    if (!loopback && !s->o->api_key)
        fprintf(stderr, "hetkv serve: warning: listening on %s without --api-key: anyone who can "
                "reach this address can use the model\n", s->o->host);
    /* a thread per open connection: bound by the requests the server takes
     * at once plus room for idle keep-alive, metrics and health clients; the
     * idle timeout does not cut a request whose answer takes longer (tried
     * with a 2 s timeout and 20 s requests, whole and streamed) */
    unsigned limit = (unsigned)(s->o->sc.max_batch + s->o->max_queue + 64);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    s->mhd = MHD_start_daemon(flags, (uint16_t)s->o->port, NULL, NULL, handle, s,
                              MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,   /* first, as asked */
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_CONNECTION_LIMIT, limit,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                              MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                              MHD_OPTION_END);
    if (!s->mhd)
        return hkv_seterr(err, HKV_E_IO, "cannot listen on %s port %lld (in use, or not an address "
                          "of this machine)", s->o->host, s->o->port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    *bound = di ? di->port : (int)s->o->port;
    return HKV_OK;
}

void hkv_srv_http_quiesce(hkv_srv *s) {
    if (!s->mhd || s->listen_fd >= 0) return;
    s->listen_fd = MHD_quiesce_daemon(s->mhd);
    /* out of LISTEN now: a new client is refused at once instead of waiting
     * in the backlog until the exit (the fd itself closes after the stop) */
    if (s->listen_fd >= 0) shutdown(s->listen_fd, SHUT_RD);
}

void hkv_srv_http_stop(hkv_srv *s) {
    if (s->mhd) MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
    if (s->listen_fd >= 0) close(s->listen_fd);   /* ours after quiesce, not before the stop */
    s->listen_fd = -1;
}
