/* GGUF reader: parse and validate the whole header at open (see gguf.h).
 *
 * All reads go through `rd`, which knows how many bytes remain, so no field
 * is read past the end. Counts coming from the file are checked against what
 * the remaining bytes could hold before anything is allocated, which bounds
 * every allocation by a small multiple of the file size. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ggml_types.h"

#define GGUF_DEFAULT_ALIGNMENT 32
/* Smallest encodings: a kv is key length (8) + type (4) + a 1-byte value; a
 * tensor info is name length (8) + n_dims (4) + one dim (8) + type (4) +
 * offset (8). */
#define KV_MIN_BYTES 13u
#define TI_MIN_BYTES 32u

typedef struct rd {
    const uint8_t *base;
    size_t size, pos;
    char who[200];   /* what is being read, for messages: "key 'general.name'" */
    hkv_err *err;
} rd;

static const int vtype_size[HKV_GGUF_VTYPE_COUNT] = {
    [HKV_GGUF_U8] = 1, [HKV_GGUF_I8] = 1, [HKV_GGUF_U16] = 2, [HKV_GGUF_I16] = 2,
    [HKV_GGUF_U32] = 4, [HKV_GGUF_I32] = 4, [HKV_GGUF_F32] = 4, [HKV_GGUF_BOOL] = 1,
    [HKV_GGUF_U64] = 8, [HKV_GGUF_I64] = 8, [HKV_GGUF_F64] = 8,
};

static const char *const vtype_names[HKV_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *hkv_gguf_vtype_name(int t) {
    return (t >= 0 && t < HKV_GGUF_VTYPE_COUNT) ? vtype_names[t] : "unknown";
}

int hkv_str_eq(hkv_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* Quoted, printable copy of a file string for messages (long ones cut). */
static const char *shown(char buf[static 96], hkv_str s) {
    size_t n = s.len < 80 ? (size_t)s.len : 80, o = 0;
    buf[o++] = '\'';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        buf[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (s.len > n) { memcpy(buf + o, "...", 3); o += 3; }
    buf[o++] = '\'';
    buf[o] = '\0';
    return buf;
}

static uint64_t le_u(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static size_t rd_left(const rd *r) { return r->size - r->pos; }

/* Check that n more bytes exist; on failure name what was being read. */
static int rd_need(rd *r, uint64_t n, const char *what) {
    if (n <= rd_left(r)) return HKV_OK;
    return hkv_seterr(r->err, HKV_E_FORMAT,
                      "%s: truncated: %s at offset %zu needs %llu bytes, only %zu left (file size %zu)",
                      r->who, what, r->pos, (unsigned long long)n, rd_left(r), r->size);
}

static int rd_uint(rd *r, int nbytes, uint64_t *out, const char *what) {
    int rc = rd_need(r, (uint64_t)nbytes, what);
    if (rc) return rc;
    *out = le_u(r->base + r->pos, nbytes);
    r->pos += (size_t)nbytes;
    return HKV_OK;
}

static int rd_u32(rd *r, uint32_t *out, const char *what) {
    uint64_t v = 0;
    int rc = rd_uint(r, 4, &v, what);
    *out = (uint32_t)v;
    return rc;
}

/* A GGUF string: u64 length then that many bytes (no terminator). */
static int rd_str(rd *r, hkv_str *out, const char *what) {
    uint64_t len;
    size_t at = r->pos;
    int rc = rd_uint(r, 8, &len, what);
    if (rc) return rc;
    if (len > rd_left(r))
        return hkv_seterr(r->err, HKV_E_FORMAT,
                          "%s: %s at offset %zu has length %llu, past the end of the file "
                          "(%zu bytes left, file size %zu)",
                          r->who, what, at, (unsigned long long)len, rd_left(r), r->size);
    out->ptr = (const char *)r->base + r->pos;
    out->len = len;
    r->pos += (size_t)len;
    return HKV_OK;
}

/* Array header and body; strings are pre-indexed into kv->arr_str. Nested
 * arrays are refused, so parsing never recurses. */
static int parse_array(rd *r, hkv_gguf_kv *kv) {
    uint32_t et;
    int rc = rd_u32(r, &et, "array element type");
    if (!rc) rc = rd_uint(r, 8, &kv->arr_n, "array element count");
    if (rc) return rc;
    if (et >= HKV_GGUF_VTYPE_COUNT)
        return hkv_seterr(r->err, HKV_E_FORMAT, "%s: array has unknown element type %u", r->who, et);
    if (et == HKV_GGUF_ARRAY)
        return hkv_seterr(r->err, HKV_E_UNSUPPORTED,
                          "%s: arrays of arrays are not supported", r->who);
    kv->arr_type = (int)et;
    kv->val = r->base + r->pos;
    uint64_t esize = et == HKV_GGUF_STRING ? 8 : (uint64_t)vtype_size[et]; /* string: its length */
    if (kv->arr_n > rd_left(r) / esize)
        return hkv_seterr(r->err, HKV_E_FORMAT,
                          "%s: truncated: array of %llu %s elements needs at least %llu "
                          "bytes per element, only %zu bytes left (file size %zu)",
                          r->who, (unsigned long long)kv->arr_n, vtype_names[et],
                          (unsigned long long)esize, rd_left(r), r->size);
    if (et != HKV_GGUF_STRING) {
        r->pos += (size_t)(kv->arr_n * esize);
        return HKV_OK;
    }
    kv->arr_str = malloc((size_t)kv->arr_n * sizeof *kv->arr_str + 1);
    if (!kv->arr_str)
        return hkv_seterr(r->err, HKV_E_NOMEM, "%s: no memory to index %llu strings",
                          r->who, (unsigned long long)kv->arr_n);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        char what[64];
        snprintf(what, sizeof what, "string #%llu of the array", (unsigned long long)i);
        if ((rc = rd_str(r, &kv->arr_str[i], what))) return rc;
    }
    return HKV_OK;
}

static int parse_kv(rd *r, hkv_gguf_kv *kv, uint64_t i) {
    char b[96];
    uint32_t t;
    snprintf(r->who, sizeof r->who, "key #%llu", (unsigned long long)i);
    int rc = rd_str(r, &kv->key, "key string");
    if (rc) return rc;
    snprintf(r->who, sizeof r->who, "key %s", shown(b, kv->key));
    if ((rc = rd_u32(r, &t, "value type"))) return rc;
    if (t >= HKV_GGUF_VTYPE_COUNT)
        return hkv_seterr(r->err, HKV_E_FORMAT, "%s has unknown value type %u", r->who, t);
    kv->type = (int)t;
    if (t == HKV_GGUF_ARRAY) return parse_array(r, kv);
    kv->val = r->base + r->pos;
    if (t == HKV_GGUF_STRING) {
        hkv_str s;
        return rd_str(r, &s, "string value");
    }
    if ((rc = rd_need(r, (uint64_t)vtype_size[t], "value"))) return rc;
    r->pos += (size_t)vtype_size[t];
    return HKV_OK;
}

/* Duplicate detection by sorting (n can be large in a hostile file). */
static int cmp_str(const void *a, const void *b) {
    const hkv_str *x = a, *y = b;
    size_t n = x->len < y->len ? (size_t)x->len : (size_t)y->len;
    int c = memcmp(x->ptr, y->ptr, n);
    if (c) return c;
    return (x->len > y->len) - (x->len < y->len);
}

static int check_unique(hkv_str *names, uint64_t n, const char *what, hkv_err *err) {
    if (n < 2) return HKV_OK;
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (uint64_t i = 1; i < n; i++) {
        if (cmp_str(&names[i - 1], &names[i]) == 0) {
            char b[96];
            return hkv_seterr(err, HKV_E_FORMAT, "duplicate %s %s", what, shown(b, names[i]));
        }
    }
    return HKV_OK;
}

static int unique_keys(hkv_gguf *g, hkv_err *err) {
    if (g->n_kv < 2) return HKV_OK;
    hkv_str *tmp = malloc((size_t)g->n_kv * sizeof *tmp);
    if (!tmp) return hkv_seterr(err, HKV_E_NOMEM, "no memory to check %llu keys", (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) tmp[i] = g->kv[i].key;
    int rc = check_unique(tmp, g->n_kv, "key", err);
    free(tmp);
    return rc;
}

static int parse_alignment(hkv_gguf *g, hkv_err *err) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const hkv_gguf_kv *kv = hkv_gguf_find(g, "general.alignment");
    if (!kv) return HKV_OK;
    if (kv->type != HKV_GGUF_U32)
        return hkv_seterr(err, HKV_E_FORMAT, "general.alignment has type %s, expected u32",
                          hkv_gguf_vtype_name(kv->type));
    uint32_t a = (uint32_t)le_u(kv->val, 4);
    if (a == 0 || (a & (a - 1)) != 0)
        return hkv_seterr(err, HKV_E_FORMAT,
                          "general.alignment = %u is not a nonzero power of two", a);
    g->alignment = a;
    return HKV_OK;
}

static int parse_tensor_info(rd *r, hkv_gguf *g, hkv_gguf_tensor *t, uint64_t i) {
    char b[96];
    uint32_t nd, type;
    uint64_t v;
    snprintf(r->who, sizeof r->who, "tensor #%llu", (unsigned long long)i);
    int rc = rd_str(r, &t->name, "tensor name");
    if (rc) return rc;
    snprintf(r->who, sizeof r->who, "tensor %s", shown(b, t->name));
    if ((rc = rd_u32(r, &nd, "n_dims"))) return rc;
    if (nd < 1 || nd > HKV_GGUF_MAX_DIMS)
        return hkv_seterr(r->err, HKV_E_FORMAT, "%s has n_dims = %u (must be 1..%d)",
                          r->who, nd, HKV_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    int64_t nel = 1;
    for (int d = 0; d < HKV_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims) continue;
        if ((rc = rd_uint(r, 8, &v, "dimension"))) return rc;
        if (v == 0)
            return hkv_seterr(r->err, HKV_E_FORMAT, "%s has ne[%d] = 0 (dims must be >= 1)", r->who, d);
        if (v > (uint64_t)INT64_MAX || (int64_t)v > INT64_MAX / nel)
            return hkv_seterr(r->err, HKV_E_FORMAT,
                              "%s: element count overflows at ne[%d] = %llu", r->who, d,
                              (unsigned long long)v);
        t->ne[d] = (int64_t)v;
        nel *= (int64_t)v;
    }
    if ((rc = rd_u32(r, &type, "tensor type"))) return rc;
    hkv_ggml_type_info ti = hkv_ggml_type_get(type < HKV_GGML_TYPE_LIMIT ? (int)type : -1);
    if (!ti.name)
        return hkv_seterr(r->err, HKV_E_FORMAT, "%s has unknown type %u", r->who, type);
    t->type = (int)type;
    if (t->ne[0] % ti.block_size != 0)
        return hkv_seterr(r->err, HKV_E_FORMAT,
                          "%s (type %s): ne[0] = %lld is not a multiple of the block size %d",
                          r->who, ti.name, (long long)t->ne[0], ti.block_size);
    size_t row = hkv_ggml_row_bytes(t->type, t->ne[0]);
    uint64_t rows = (uint64_t)(nel / t->ne[0]);
    if (row == 0 || rows > SIZE_MAX / row)
        return hkv_seterr(r->err, HKV_E_FORMAT, "%s: size in bytes overflows", r->who);
    t->nbytes = row * (size_t)rows;
    if ((rc = rd_uint(r, 8, &t->offset, "tensor data offset"))) return rc;
    if (t->offset % g->alignment != 0)
        return hkv_seterr(r->err, HKV_E_FORMAT,
                          "%s has offset %llu, not a multiple of the alignment %llu", r->who,
                          (unsigned long long)t->offset, (unsigned long long)g->alignment);
    return HKV_OK;
}

static int cmp_offset(const void *a, const void *b) {
    const hkv_gguf_tensor *x = *(const hkv_gguf_tensor *const *)a, *y = *(const hkv_gguf_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Place every tensor inside the data section; refuse overlapping tensors. */
static int place_tensors(hkv_gguf *g, uint64_t data_start, hkv_err *err) {
    char b[96];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        hkv_gguf_tensor *t = &g->tensors[i];
        uint64_t end = data_start + t->offset; /* data_start <= SIZE_MAX + 2^31: no wrap yet */
        int wrap = end < t->offset || end + t->nbytes < end;
        end += t->nbytes;
        if (wrap || end > g->size) {
            if (wrap)
                return hkv_seterr(err, HKV_E_FORMAT,
                                  "tensor %s (offset %llu, %zu bytes) ends beyond 2^64, past the "
                                  "end of the file (size %zu)", shown(b, t->name),
                                  (unsigned long long)t->offset, t->nbytes, g->size);
            return hkv_seterr(err, HKV_E_FORMAT,
                              "tensor %s (offset %llu, %zu bytes) ends at file offset %llu, past "
                              "the end of the file (size %zu)", shown(b, t->name),
                              (unsigned long long)t->offset, t->nbytes, (unsigned long long)end,
                              g->size);
        }
        t->data = g->data + t->offset;
    }
    if (g->n_tensors < 2) return HKV_OK;
    const hkv_gguf_tensor **by = malloc((size_t)g->n_tensors * sizeof *by);
    if (!by) return hkv_seterr(err, HKV_E_NOMEM, "no memory to sort %llu tensors",
                               (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) by[i] = &g->tensors[i];
    qsort(by, (size_t)g->n_tensors, sizeof *by, cmp_offset);
    int rc = HKV_OK;
    for (uint64_t i = 1; i < g->n_tensors && !rc; i++) {
        const hkv_gguf_tensor *p = by[i - 1], *q = by[i];
        if (p->offset + p->nbytes > q->offset) {
            char b2[96];
            rc = hkv_seterr(err, HKV_E_FORMAT, "tensors %s and %s overlap (offsets %llu and %llu)",
                            shown(b, p->name), shown(b2, q->name),
                            (unsigned long long)p->offset, (unsigned long long)q->offset);
        }
    }
    free(by);
    return rc;
}

static int parse_header(rd *r, hkv_gguf *g) {
    uint32_t magic;
    strcpy(r->who, "header");
    int rc = rd_u32(r, &magic, "magic");
    if (rc) return rc;
    if (memcmp(r->base, "GGUF", 4) != 0)
        return hkv_seterr(r->err, HKV_E_FORMAT,
                          "not a GGUF file: magic bytes are %02x %02x %02x %02x, expected \"GGUF\"",
                          r->base[0], r->base[1], r->base[2], r->base[3]);
    if ((rc = rd_u32(r, &g->version, "version"))) return rc;
    uint32_t v = g->version;
    uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
    if (v == 1)
        return hkv_seterr(r->err, HKV_E_UNSUPPORTED,
                          "GGUF version 1 is not supported (only versions 2 and 3)");
    if (v != 2 && v != 3 && swapped >= 1 && swapped <= 3)
        return hkv_seterr(r->err, HKV_E_UNSUPPORTED,
                          "GGUF version field 0x%08x looks byte-swapped: big-endian files are "
                          "not supported", v);
    if (v != 2 && v != 3)
        return hkv_seterr(r->err, HKV_E_UNSUPPORTED,
                          "unsupported GGUF version %u (only versions 2 and 3)", v);
    if ((rc = rd_uint(r, 8, &g->n_tensors, "tensor count"))) return rc;
    if ((rc = rd_uint(r, 8, &g->n_kv, "key/value count"))) return rc;
    size_t left = rd_left(r);
    if (g->n_kv > left / KV_MIN_BYTES)
        return hkv_seterr(r->err, HKV_E_FORMAT,
                          "n_kv = %llu is impossible: the %zu bytes after the header hold at most "
                          "%zu key/value pairs", (unsigned long long)g->n_kv, left, left / KV_MIN_BYTES);
    if (g->n_tensors > left / TI_MIN_BYTES)
        return hkv_seterr(r->err, HKV_E_FORMAT,
                          "n_tensors = %llu is impossible: the %zu bytes after the header hold at "
                          "most %zu tensor infos", (unsigned long long)g->n_tensors, left,
                          left / TI_MIN_BYTES);
    if (g->n_kv * KV_MIN_BYTES + g->n_tensors * TI_MIN_BYTES > left)
        return hkv_seterr(r->err, HKV_E_FORMAT,
                          "n_kv = %llu and n_tensors = %llu cannot both fit in the %zu bytes after "
                          "the header", (unsigned long long)g->n_kv,
                          (unsigned long long)g->n_tensors, left);
    return HKV_OK;
}

static int parse(hkv_gguf *g, hkv_err *err) {
    rd r = {.base = g->map, .size = g->size, .pos = 0, .err = err};
    int rc = parse_header(&r, g);
    if (rc) return rc;
    /* counts were bounded by the file size, so these allocations are too */
    if (g->n_kv && !(g->kv = calloc((size_t)g->n_kv, sizeof *g->kv)))
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for %llu keys", (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = parse_kv(&r, &g->kv[i], i))) return rc;
    if ((rc = unique_keys(g, err)) || (rc = parse_alignment(g, err))) return rc;
    if (g->n_tensors && !(g->tensors = calloc((size_t)g->n_tensors, sizeof *g->tensors)))
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for %llu tensors",
                          (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = parse_tensor_info(&r, g, &g->tensors[i], i))) return rc;
    if (g->n_tensors > 1) {
        hkv_str *names = malloc((size_t)g->n_tensors * sizeof *names);
        if (!names) return hkv_seterr(err, HKV_E_NOMEM, "no memory to check tensor names");
        for (uint64_t i = 0; i < g->n_tensors; i++) names[i] = g->tensors[i].name;
        rc = check_unique(names, g->n_tensors, "tensor name", err);
        free(names);
        if (rc) return rc;
    }
    /* the data section starts at the next multiple of the alignment */
    uint64_t data_start = ((uint64_t)r.pos + g->alignment - 1) / g->alignment * g->alignment;
    g->data = data_start <= g->size ? (const uint8_t *)g->map + data_start : NULL;
    if (g->n_tensors && !g->data)
        return hkv_seterr(err, HKV_E_FORMAT,
                          "data section would start at offset %llu, past the end of the file "
                          "(size %zu)", (unsigned long long)data_start, g->size);
    return place_tensors(g, data_start, err);
}

static int open_mapped(hkv_gguf **out, void *map, size_t size, int owns, const char *name,
                       hkv_err *err) {
    hkv_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (owns) munmap(map, size);
        return hkv_seterr(err, HKV_E_NOMEM, "%s: no memory for the GGUF handle", name);
    }
    g->map = map;
    g->size = size;
    g->owns_map = owns;
    int rc = parse(g, err);
    if (rc) {
        hkv_err_prefix(err, "%s", name);
        hkv_gguf_close(g);
        return rc;
    }
    *out = g;
    return HKV_OK;
}

int hkv_gguf_open_buffer(hkv_gguf **out, const void *buf, size_t size, hkv_err *err) {
    if (!out) return hkv_seterr(err, HKV_E_INVAL, "hkv_gguf_open_buffer: out is NULL");
    *out = NULL;
    if (!buf && size)
        return hkv_seterr(err, HKV_E_INVAL, "hkv_gguf_open_buffer: buffer is NULL");
    static const uint8_t empty[1];
    /* the handle never writes through map; the cast only fits the struct */
    return open_mapped(out, (void *)(buf ? buf : empty), size, 0, "GGUF buffer", err);
}

int hkv_gguf_open(hkv_gguf **out, const char *path, hkv_err *err) {
    if (!out) return hkv_seterr(err, HKV_E_INVAL, "hkv_gguf_open: out is NULL");
    *out = NULL;
    if (!path) return hkv_seterr(err, HKV_E_INVAL, "hkv_gguf_open: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return hkv_seterr(err, HKV_E_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return hkv_seterr(err, HKV_E_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return hkv_seterr(err, HKV_E_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return hkv_seterr(err, HKV_E_FORMAT, "%s: file is empty, not a GGUF file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return hkv_seterr(err, HKV_E_RANGE, "%s: file of %lld bytes does not fit in memory",
                          path, (long long)st.st_size);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED)
        return hkv_seterr(err, HKV_E_IO, "%s: cannot mmap %zu bytes: %s", path, size, strerror(e));
    return open_mapped(out, map, size, 1, path, err);
}

void hkv_gguf_close(hkv_gguf *g) {
    if (!g) return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++) free(g->kv[i].arr_str);
    free(g->kv);
    free(g->tensors);
    if (g->owns_map) munmap(g->map, g->size);
    free(g);
}

/* ---- lookups and typed getters ----------------------------------------- */

const hkv_gguf_kv *hkv_gguf_find(const hkv_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (hkv_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const hkv_gguf_tensor *hkv_gguf_find_tensor(const hkv_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (hkv_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

/* Find key or say why not; also checks the arguments every getter shares. */
static int lookup(const hkv_gguf *g, const char *key, const void *out, const hkv_gguf_kv **kv,
                  hkv_err *err) {
    if (!g || !key || !out) return hkv_seterr(err, HKV_E_INVAL, "gguf getter: NULL argument");
    *kv = hkv_gguf_find(g, key);
    if (!*kv) return hkv_seterr(err, HKV_E_NOTFOUND, "GGUF key '%s' not found", key);
    return HKV_OK;
}

static int wrong_type(const hkv_gguf_kv *kv, const char *key, const char *want, hkv_err *err) {
    if (kv->type == HKV_GGUF_ARRAY)
        return hkv_seterr(err, HKV_E_FORMAT, "GGUF key '%s' is an array of %s, expected %s", key,
                          hkv_gguf_vtype_name(kv->arr_type), want);
    return hkv_seterr(err, HKV_E_FORMAT, "GGUF key '%s' has type %s, expected %s", key,
                      hkv_gguf_vtype_name(kv->type), want);
}

/* Integer value widened: unsigned types set *u, signed ones *s. */
static int int_value(const hkv_gguf_kv *kv, int *is_signed, uint64_t *u, int64_t *s) {
    int n = 0, sgn = 0;
    switch (kv->type) {
    case HKV_GGUF_U8: n = 1; break;
    case HKV_GGUF_I8: n = 1; sgn = 1; break;
    case HKV_GGUF_U16: n = 2; break;
    case HKV_GGUF_I16: n = 2; sgn = 1; break;
    case HKV_GGUF_U32: n = 4; break;
    case HKV_GGUF_I32: n = 4; sgn = 1; break;
    case HKV_GGUF_U64: n = 8; break;
    case HKV_GGUF_I64: n = 8; sgn = 1; break;
    default: return 0;
    }
    uint64_t v = le_u(kv->val, n);
    *is_signed = sgn;
    *u = v;
    if (sgn) {
        /* sign-extend without relying on implementation-defined conversion */
        uint64_t m = n == 8 ? 0 : (uint64_t)1 << (8 * n - 1);
        *s = n == 8 ? (v >> 63 ? -(int64_t)(~v) - 1 : (int64_t)v)
                    : (int64_t)(v ^ m) - (int64_t)m;
    }
    return 1;
}

int hkv_gguf_get_i64(const hkv_gguf *g, const char *key, int64_t *out, hkv_err *err) {
    const hkv_gguf_kv *kv;
    int rc = lookup(g, key, out, &kv, err), sgn;
    uint64_t u;
    int64_t s = 0;
    if (rc) return rc;
    if (!int_value(kv, &sgn, &u, &s)) return wrong_type(kv, key, "an integer", err);
    if (!sgn && u > (uint64_t)INT64_MAX)
        return hkv_seterr(err, HKV_E_RANGE, "GGUF key '%s' = %llu does not fit in int64", key,
                          (unsigned long long)u);
    *out = sgn ? s : (int64_t)u;
    return HKV_OK;
}

int hkv_gguf_get_u32(const hkv_gguf *g, const char *key, uint32_t *out, hkv_err *err) {
    const hkv_gguf_kv *kv;
    int rc = lookup(g, key, out, &kv, err), sgn;
    uint64_t u;
    int64_t s = 0;
    if (rc) return rc;
    if (!int_value(kv, &sgn, &u, &s)) return wrong_type(kv, key, "an integer", err);
    if (sgn && (s < 0 || s > (int64_t)UINT32_MAX))
        return hkv_seterr(err, HKV_E_RANGE, "GGUF key '%s' = %lld does not fit in u32", key,
                          (long long)s);
    if (!sgn && u > UINT32_MAX)
        return hkv_seterr(err, HKV_E_RANGE, "GGUF key '%s' = %llu does not fit in u32", key,
                          (unsigned long long)u);
    *out = sgn ? (uint32_t)s : (uint32_t)u;
    return HKV_OK;
}

int hkv_gguf_get_f32(const hkv_gguf *g, const char *key, float *out, hkv_err *err) {
    const hkv_gguf_kv *kv;
    int rc = lookup(g, key, out, &kv, err);
    if (rc) return rc;
    if (kv->type == HKV_GGUF_F32) {
        uint32_t b = (uint32_t)le_u(kv->val, 4);
        memcpy(out, &b, 4);
        return HKV_OK;
    }
    if (kv->type != HKV_GGUF_F64) return wrong_type(kv, key, "f32 or f64", err);
    uint64_t b = le_u(kv->val, 8);
    double d;
    memcpy(&d, &b, 8);
    float f = (float)d;
    if (isfinite(d) && isinf(f))
        return hkv_seterr(err, HKV_E_RANGE, "GGUF key '%s' = %g does not fit in f32", key, d);
    *out = f;
    return HKV_OK;
}

int hkv_gguf_get_bool(const hkv_gguf *g, const char *key, int *out, hkv_err *err) {
    const hkv_gguf_kv *kv;
    int rc = lookup(g, key, out, &kv, err);
    if (rc) return rc;
    if (kv->type != HKV_GGUF_BOOL) return wrong_type(kv, key, "bool", err);
    *out = kv->val[0] != 0;
    return HKV_OK;
}

int hkv_gguf_get_str(const hkv_gguf *g, const char *key, hkv_str *out, hkv_err *err) {
    const hkv_gguf_kv *kv;
    int rc = lookup(g, key, out, &kv, err);
    if (rc) return rc;
    if (kv->type != HKV_GGUF_STRING) return wrong_type(kv, key, "string", err);
    out->len = le_u(kv->val, 8);
    out->ptr = (const char *)kv->val + 8;
    return HKV_OK;
}

int hkv_gguf_get_arr(const hkv_gguf *g, const char *key, int elem_type, const hkv_gguf_kv **out,
                     hkv_err *err) {
    const hkv_gguf_kv *kv;
    int rc = lookup(g, key, out, &kv, err);
    if (rc) return rc;
    if (kv->type != HKV_GGUF_ARRAY || kv->arr_type != elem_type) {
        char want[40];
        snprintf(want, sizeof want, "an array of %s", hkv_gguf_vtype_name(elem_type));
        return wrong_type(kv, key, want, err);
    }
    *out = kv;
    return HKV_OK;
}
