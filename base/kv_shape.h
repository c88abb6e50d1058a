/* The shape of a model's KV cache: what the caches (kv/kv.h) and the
 * policies that index them (index/policy.h) agree on, defined below both so
 * that neither reaches up into the other. */
#ifndef HKV_KV_SHAPE_H
#define HKV_KV_SHAPE_H

typedef struct hkv_kv_shape {
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;
} hkv_kv_shape;

#endif
