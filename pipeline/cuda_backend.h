/* The CUDA backend of the forward pass (runtime/backend.h) and the CPU-GPU
 * co-execution pipeline it runs for attention.
 *
 * Weights (in their repacked 4/8-bit, fp16 or fp32 formats), activations,
 * the near tier (sinks + local ring of every sequence and layer) live on the
 * device; the far tier, the policies and their indexes stay with the tiered
 * KV cache in (page-locked) host memory. One attention step, per layer:
 *
 *   device stream : QKV ready -> download QKV -> append K/V to the near tier
 *                   -> near attention (out, lse) ............ wait -> merge
 *   CPU workers   :              (event) -> policy select + far attention
 *                                           -> upload far (out, lse) ---^
 *
 * so the device's near attention runs while the CPU attends the far tier,
 * and the two partials merge exactly on the device. Prompt rows are attended
 * on the device over its copy of the prompt's K/V, the keys past that copy
 * streamed from the far tier (cuda_prefill.c, cuda_prefill_stream.c); a later
 * turn's prompt by the host over the far tier. The device keeps a mirror of
 * each (sequence, layer) near tier that it appends to as decode steps go;
 * when the host's changed in another way (a prompt ended, a rewind, a copy:
 * hkv_kv_seq_epoch), the host's copy is uploaded whole before the
 * device attends it. With micro-batch
 * ping-pong (hkv_cuda_params.pingpong) a decode batch runs as two halves,
 * one's host part beside the other's device work (runtime/forward_pingpong.c). */
#ifndef HKV_CUDA_BACKEND_H
#define HKV_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "policy.h"
#include "status.h"

struct hkv_engine;

typedef struct hkv_cuda_params {
    int device;            /* CUDA device index */
    size_t gpu_mem;        /* cap on device bytes (0: the device's free memory) */
    int gemm;              /* the weight GEMMs' path (> 8 rows), enum hkv_qmat_gemm;
                              -1: the device's (hkv_gpu_tensor_split_pays) */
    int profile;           /* time every backend op on the device (a pair of events
                              around each, a few us of host time per op) into
                              hkv_pipeline_stats.dev_op; 0: the products only */
    int lockstep;          /* 1: the host runs every layer's far step before the device goes
                              on, even where the far partial is empty (the baseline of the
                              deferred host step, for A/B measurements) */
    int pingpong;          /* 1: micro-batch ping-pong, a decode batch of 2 or more rows split in
                              two halves whose device and host parts overlap (forward.c) */
    int64_t prompt_keys;   /* the most prompt tokens whose K/V the device copies while a prompt
                              is fed (cuda_prefill.c): 0 as many as fit, -1 none; the keys past
                              the copy stream from the far tier, a block at a time */
    int64_t prompt_block;  /* keys per streamed block (0: HKV_PROMPT_BLOCK_DEFAULT) */
    int graphs_off;        /* 1: no CUDA graphs, every op of a step queued on its own (the A/B
                              baseline of the replayed decode step, cuda_graph.c) */
    size_t offload_mem;    /* the most device bytes one prompt-end offload (ctkvr's index
                              build, the window scores: cuda_index.c) may take; past it the
                              host does that work (fallbacks no_room). 0: what is free (the
                              build's own workspace at most 256 MiB) */
    int resident_seqs;     /* `full` sequences whose whole far tier the device keeps too
                              (cuda_resident.c; --gpu-resident, the placement of --policy
                              auto): decode attention on the device alone, the host
                              attending only the rows not yet uploaded. 0: none */
    int resident_chunk;    /* far rows a resident copy lags by at most, copied up together
                              (one pair of copies per KV head, not one per row and step);
                              0: HKV_RESIDENT_CHUNK_DEFAULT */
    int64_t resident_rows; /* far rows a resident slot holds: a sequence's own rows past a
                              shared prefix kept in a prefix slot, or its whole far tier;
                              one that outgrows them runs on the host (no_room). 0: a whole
                              context (n_ctx less the near tier) */
    int resident_prefixes; /* prefix slots of a whole context each: a prefix that resident
                              sequences share by reference (hkv_far_view.shared_id) kept
                              once on the device for all of them. 0: none */
    int wait_spin_us;      /* the host's waits for the device inside a step (a layer's QKV rows
                              before its far part, a deferred step's rows) poll the event for up
                              to this many us before sleeping on it: a sleeping thread is woken
                              by the driver's interrupt, slow on a virtual machine, and the
                              waiting thread's team has nothing to do meanwhile. -1: sleep at
                              once; 0: HKV_WAIT_SPIN_US_DEFAULT (under the emulator, whose
                              device runs on the host's cores: sleep at once) */
    int team_spin;         /* 1: while the host waits for the device inside a step, the OpenMP
                              team waits with it, spinning, so that the far part after the
                              wait starts on a hot team (the runtime's workers otherwise sleep
                              past their spin and are woken by the next parallel region: the
                              host's fixed cost a layer that the H200 run fitted at ~270 us);
                              costs every core while the device works (--gpu-team-spin) */
} hkv_cuda_params;

/* 2 ms: longer than a layer's device work between the host's far part and
 * the next layer's QKV rows at the batches the split runs (Llama-3-8B's
 * products at batch 8: ~0.25 ms a layer on an H200), so a wait ends in the
 * poll; a longer one (a prompt chunk) sleeps after it. */
#define HKV_WAIT_SPIN_US_DEFAULT 2000

/* 256 rows: at Llama-3-8B's shape 8 KV heads x 256 rows of 512 bytes of K
 * and of V per copy, and a tail the host attends in microseconds. */
#define HKV_RESIDENT_CHUNK_DEFAULT 256

/* Keys per block of a streamed prompt: 16 MiB of K and V for each staging
 * buffer at Llama-3-8B's 8 KV heads of 128, enough attention per block
 * (4096 keys x the chunk's rows) to hide its PCIe copy behind the last. */
#define HKV_PROMPT_BLOCK_DEFAULT 4096

/* The backend ops the profile times, each its own row of dev_op (the
 * products by weight role). */
enum hkv_dev_op {
    HKV_DEV_OP_EMBED, HKV_DEV_OP_RMSNORM, HKV_DEV_OP_QKV, HKV_DEV_OP_WO, HKV_DEV_OP_FFN_IN,
    HKV_DEV_OP_DOWN, HKV_DEV_OP_HEAD, HKV_DEV_OP_ROPE, HKV_DEV_OP_ATTENTION, HKV_DEV_OP_SWIGLU,
    HKV_DEV_OP_ADD, HKV_DEV_OP_COPY, HKV_DEV_OP_COUNT
};
/* "embed", "rmsnorm", "qkv", ... (NULL past the end). */
const char *hkv_dev_op_name(int op);

/* The step timeline, summed over forward calls. Host figures are wall
 * clock; device figures come from CUDA events (under the emulator they time
 * the emulation: they show the structure, not GPU speed). */
typedef struct hkv_pipeline_stats {
    int64_t layer_steps;        /* attention steps (one per layer per forward call) */
    int64_t pingpong_steps;     /* of which a micro-batch's, begun and ended apart */
    int64_t host_deferred;      /* of which the host ran after the device went on: every row's far
                                   partial empty (all its keys near), nothing for the host to
                                   return; the host catches up by the end of the call */
    int64_t decode_rows, prompt_rows;
    int64_t graph_steps;        /* forward calls whose embedding and layers ran as one launch of
                                   a recorded graph (cuda_graph.c) */
    int64_t graph_captures;     /* of which recorded in that call (a batch shape's first) */
    int64_t graph_nodes;        /* operations of the graphs launched (summed over the calls) */
    int64_t prompt_rows_dev;    /* (prompt row, layer) attended on the device */
    int64_t prompt_rows_host;   /* (prompt row, layer) attended by the host (no room on the
                                   device, a later turn, selected positions) */
    int64_t prompt_rows_streamed;   /* of prompt_rows_dev, those whose earlier keys came from
                                   the far tier through the device (no room for the copy) */
    double cpu_busy;            /* s: host far-tier attention (policy select + sparse) */
    double cpu_wait_dev;        /* s: host blocked until the device's QKV arrived */
    int64_t host_waits;         /* the host's waits for the device's rows (a layer's far part,
                                   a deferred step) that found them not yet there */
    int64_t host_waits_slept;   /* of which outlasted the poll (hkv_cuda_params.wait_spin_us)
                                   and slept on the event */
    double dev_near;            /* s: device near-tier append + attention */
    double dev_wait_cpu;        /* s: device idle from its near partial to the far partial */
    double dev_products;        /* s: device time in the weight products (the layers' QKV, O,
                                   gate/up and down, and the head), events around each */
    double dev_total;           /* s: device time of the forward calls, from the call's first op
                                   to its last (its waits for the host included) */
    double dev_op[HKV_DEV_OP_COUNT];   /* s: device time per op (events around it: the
                                   kernels, the gaps between them, and for attention the
                                   wait for the host's far partial); the products always,
                                   the rest with hkv_cuda_params.profile */
    double host_op[HKV_DEV_OP_COUNT];  /* s: host time inside each op's call (with the
                                   profile): the launches and copies it queues, and any
                                   wait in it; their sum against the step's wall time says
                                   whether the host's queueing or the device bounds a step */
    uint64_t bytes_d2h, bytes_h2d;   /* per-step copies (QKV down; far partials, mirror, indices up) */
    int64_t near_resyncs;       /* (sequence, layer) near tiers uploaded whole from the host */
    int64_t recall_rows;        /* (decode row, layer) recalls run on the device */
    int64_t recall_resyncs;     /* (sequence, layer) recall tables uploaded whole */
    int64_t keep_rows;          /* (decode row, layer) whose policy's kept rows the device attends */
    int64_t keep_resyncs;       /* (sequence, layer) kept sets copied up (prompt end, re-selection) */
    int64_t resident_rows;      /* (decode row, layer) whose whole far tier the device attends
                                   (a resident `full` sequence, cuda_resident.c) */
    int64_t resident_rows_up;   /* (KV head-wide) far rows copied to resident slots */
    int64_t resident_resyncs;   /* (sequence, layer) resident copies begun again (a new
                                   sequence in the slot, a rewind) */
    int64_t resident_prefix_rows;  /* of resident_rows, those that read a prefix slot */
    int64_t resident_prefix_up;    /* (KV head-wide) far rows copied to prefix slots */
    int64_t resident_prefix_groups;   /* (group, layer) cascades over a prefix slot: each read
                                         it once for all of its group's rows */
    int64_t device_selects;     /* (decode row, layer) far selections made on the device (quest's
                                   pages, rocketkv's stage 2) */
    int64_t page_resyncs;       /* (sequence, layer) page bounds (quest) or candidate lists
                                   (rocketkv) uploaded whole */
    int64_t index_builds_dev;   /* (sequence, layer) prompt-end index builds on the device */
    int64_t index_builds_host;  /* offered to the device but built by the host (a later
                                   turn's partial rebuild, a shape, no room: in fallbacks) */
    int64_t window_scores_dev;  /* (sequence, layer) prompt-end window scores on the device
                                   (snapkv, rocketkv's stage 1, fastkv, laq, speckv) */
    int64_t window_scores_host; /* offered to the device but scored by the host (absent
                                   positions after a token-selective prefill, a shape, no
                                   room: in fallbacks) */
    int64_t fallbacks[HKV_FALLBACK_COUNT];   /* work the device offers done by the host
                                   instead, by reason (enum hkv_fallback, index/policy.h):
                                   (sequence, layer) prompt-end builds and scorings,
                                   (decode row, layer) device selections (a kept set, pages,
                                   candidate lists, a recall) the policy or the device could
                                   not give while the far tier held tokens, and (prompt row,
                                   layer)s of a head size the prefill kernels do not take */
    size_t dev_peak, dev_in_use;     /* device bytes, all tiers */
    size_t dev_tier[5];              /* in use per tier (enum hkv_tier) */
} hkv_pipeline_stats;

/* Create the CUDA backend for engine e (its model loaded, its KV cache the
 * tiered one) and upload the weights. Errors: no device (HKV_E_DEVICE), the
 * cap or the device refusing memory (HKV_E_CAPACITY / HKV_E_NOMEM, naming
 * the tier, the bytes asked and what is free), a KV cache that is not
 * tiered (HKV_E_UNSUPPORTED). Nothing is left allocated on failure. */
int hkv_cuda_backend_create(hkv_backend *be, struct hkv_engine *e, const hkv_cuda_params *p,
                            hkv_err *err);

/* 1 when be is a CUDA backend. */
int hkv_backend_is_cuda(const hkv_backend *be);

/* The timeline so far (waits for the device first). */
int hkv_cuda_backend_stats(const hkv_backend *be, hkv_pipeline_stats *out, hkv_err *err);
void hkv_cuda_backend_stats_reset(hkv_backend *be);

#endif
