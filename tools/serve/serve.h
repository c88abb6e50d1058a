/* hetkv serve: an OpenAI-compatible HTTP server on the continuous-batching
 * scheduler (runtime/scheduler.h), docs/SERVE.md.
 *
 * Threads: libmicrohttpd runs one thread per connection (serve_http.c); the
 * thread that opened the engine is the engine thread (cmd_serve.c), the only
 * one that touches the scheduler. A connection thread parses and tokenises
 * its request (serve_api.c), queues it for the engine thread and waits on
 * the request's condition variable; after each step the engine thread copies
 * each request's new text into the request (the part that can no longer be
 * cut by a stop string) and signals it, so a connection streams while the
 * batch runs. One mutex (hkv_srv.mu) guards the queue, the shared fields of
 * every request and the metrics; it is never held during a step. */
#ifndef HKV_SERVE_H
#define HKV_SERVE_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "batch.h"
#include "cli.h"

typedef struct hkv_srv_opts {
    const char *model, *host, *api_key;
    long long port, max_queue, max_body;
    double drain_s;       /* after SIGINT/SIGTERM: in-flight requests may finish this long */
    int quiet;
    hkv_sched_cli sc;     /* --max-batch, --mem, --chunk, -c (batch.h) */
    hkv_exec_cli x;
    hkv_kv_cli kv;
    hkv_device_cli dev;
} hkv_srv_opts;

/* One completion request. `it` is the connection thread's until queued, then
 * the engine thread's until done; the fields marked (mu) are shared. */
typedef struct hkv_srv_req {
    hkv_batch_item it;
    hkv_policy_args pargs;        /* the request's own policy's arguments (it.req.policy) */
    int stream, include_usage;
    long long created;            /* unix time, the response's "created" */
    pthread_cond_t cv;            /* new text, or done */
    struct hkv_srv_req *next;     /* (mu) the engine's incoming queue */
    struct hkv_srv_req *enext;    /* the engine thread's list of submitted requests */
    size_t published;             /* engine thread: bytes of it.req.text copied to out */
    /* (mu) engine -> connection */
    char *out;                    /* the text so far: always a prefix of the final text */
    size_t out_len, out_cap;
    int done;                     /* it.req is final; http_status and err say how */
    int http_status;              /* 200, or the error's status */
    hkv_err err;
    /* (mu) connection -> engine */
    int cancel;                   /* the client went away */
    int conn_gone, eng_gone;      /* each side's release; the second frees */
} hkv_srv_req;

enum { HKV_SRV_CODES = 12 };

typedef struct hkv_srv_metrics {
    int code[HKV_SRV_CODES];              /* HTTP statuses seen ... */
    long long n_code[HKV_SRV_CODES];      /* ... and the responses sent with each */
    long long cancelled, refused_queue;   /* client gone; 503 with a full queue */
    long long prompt_tokens, gen_tokens;
    int running, queued;                  /* scheduler, after the last step */
    long long steps;
    double step_s;                        /* prefill + decode seconds of those steps */
    uint64_t kv_reserved;                 /* KV bytes reserved for the running requests */
    long long prefix_hits, prefix_tokens; /* requests from a kept prefix, tokens not prefilled */
    uint64_t prefix_bytes;                /* the kept prefixes' KV reservations */
    uint64_t prefix_saved;                /* far-tier bytes shared rather than copied */
    long long prefix_index_hits;          /* requests that took a kept prefix's index (ctkvr) */
    uint64_t tier_bytes[HKV_TIER_COUNT];  /* the engine's host memory per tier */
} hkv_srv_metrics;

typedef struct hkv_srv {
    const hkv_srv_opts *o;
    hkv_engine *e;                /* read-only outside the engine thread: tokenizer, config */
    const char *model_name;
    const char *policy;           /* the engine's policy ("full", ..., "plain") */
    hkv_batch_defaults dflt_chat, dflt_cmpl;
    pthread_mutex_t mu;
    pthread_cond_t engine_cv;     /* work for the engine thread */
    hkv_srv_req *in_head, *in_tail;   /* (mu) queued for submission */
    int n_open;                   /* (mu) handed to the engine and not finished */
    int stopping;                 /* (mu) shutting down: new requests get 503 */
    long long next_id;            /* (mu) */
    int n_live;                   /* (mu) requests not yet freed: answers still being sent */
    hkv_srv_metrics m;            /* (mu) */
    struct MHD_Daemon *mhd;
    int listen_fd;                /* after quiesce: closed once the daemon has stopped */
} hkv_srv;

/* serve_http.c: the listening daemon (thread per connection) on o->host:port;
 * *bound gets the port actually bound (port 0: any free one). */
int hkv_srv_http_start(hkv_srv *s, int *bound, hkv_err *err);
/* Stop accepting new connections (those open may still finish). */
void hkv_srv_http_quiesce(hkv_srv *s);
/* Close every connection and join their threads; requests must be done. */
void hkv_srv_http_stop(hkv_srv *s);

/* serve_api.c: the OpenAI side. Parse and tokenise a request body into r
 * (chat: /v1/chat/completions); the error's status is 400. */
int hkv_srv_parse(hkv_srv *s, const char *body, size_t len, int chat, hkv_srv_req *r,
                  hkv_err *err);
/* Response bodies (malloc'd, NUL-terminated): the whole completion; an
 * {"error": ...} object; /v1/models; /metrics (Prometheus text, takes mu). */
char *hkv_srv_completion_json(const hkv_srv *s, const hkv_srv_req *r);
char *hkv_srv_error_json(int status, const char *msg, const char *code);
char *hkv_srv_models_json(const hkv_srv *s);
char *hkv_srv_metrics_text(hkv_srv *s);
/* One server-sent event "data: ...\n\n" of a streamed response: the first
 * chunk (first = 1: the chat role), a text delta, the last chunk with the
 * finish reason (delta NULL), the usage chunk (usage = 1), or [DONE]
 * (done = 1). */
char *hkv_srv_sse_chunk(const hkv_srv *s, const hkv_srv_req *r, const char *delta, size_t n,
                        int first, int usage, int done);

/* cmd_serve.c: hand a parsed request to the engine thread (under mu), and
 * give up a side's hold on it (mu held by the caller: the second frees). */
void hkv_srv_enqueue(hkv_srv *s, hkv_srv_req *r);
void hkv_srv_release(hkv_srv *s, hkv_srv_req *r, int engine_side);
void hkv_srv_count(hkv_srv *s, int status);   /* a response sent (mu held) */

int hkv_cmd_serve(int argc, char **argv);

#endif
