/* The MPI transport of hetkv batch (batch_mpi.h). Why plain point-to-point
 * messages and not collectives: requests are handed out one by one as
 * workers ask (a 6K-token prompt costs twenty times a 256-token one, so a
 * static split leaves ranks idle), and results come back whenever they
 * finish; only rank 0 touches the files, so a rerun resumes from its output
 * alone whatever the number of ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch_mpi.h"

#ifdef HKV_HAVE_MPI
#include <mpi.h>
#endif

static int launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

#ifdef HKV_HAVE_MPI

static int mpi_err(hkv_err *err, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, msg, &n) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return hkv_seterr(err, HKV_E_IO, "MPI %s: %s", what, msg);
}

int hkv_mpi_start(hkv_mpi *m, int want, hkv_err *err) {
    *m = (hkv_mpi){0, 0, 1};
    if (!want || !launched()) return HKV_OK;
    int rc = MPI_Init(NULL, NULL);
    if (rc != MPI_SUCCESS) return mpi_err(err, rc, "init");
    /* errors come back as codes and are reported by name, not by a crash */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &m->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &m->size);
    m->active = 1;
    return HKV_OK;
}

void hkv_mpi_stop(hkv_mpi *m, int code) {
    if (!m->active) return;
    if (code) MPI_Abort(MPI_COMM_WORLD, code);
    else MPI_Finalize();
    m->active = 0;
}

int hkv_mpi_send(hkv_mpi *m, int dst, int tag, const int64_t hdr[4], const char *text,
                 size_t len, hkv_err *err) {
    (void)m;
    const size_t n = 4 * sizeof(int64_t) + len;
    if (n > (size_t)INT32_MAX) return hkv_seterr(err, HKV_E_RANGE, "MPI message of %zu bytes", n);
    char *buf = malloc(n);
    if (!buf) return hkv_seterr(err, HKV_E_NOMEM, "no memory for an MPI message of %zu bytes", n);
    int64_t h[4] = {0};
    if (hdr) memcpy(h, hdr, sizeof h);
    memcpy(buf, h, sizeof h);
    if (len) memcpy(buf + sizeof h, text, len);
    int rc = MPI_Send(buf, (int)n, MPI_BYTE, dst, tag, MPI_COMM_WORLD);
    free(buf);
    return rc == MPI_SUCCESS ? HKV_OK : mpi_err(err, rc, "send");
}

int hkv_mpi_poll(hkv_mpi *m, int block, hkv_mpi_msg *msg, hkv_err *err) {
    (void)m;
    MPI_Status st;
    int flag = 0, rc;
    if (block) {
        rc = MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        flag = 1;
    } else {
        rc = MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
    }
    if (rc != MPI_SUCCESS) return mpi_err(err, rc, "probe");
    if (!flag) return 0;
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    if (n < (int)(4 * sizeof(int64_t)))
        return hkv_seterr(err, HKV_E_FORMAT, "MPI message of %d bytes from rank %d: too short", n,
                          st.MPI_SOURCE);
    char *buf = malloc((size_t)n + 1);
    if (!buf) return hkv_seterr(err, HKV_E_NOMEM, "no memory for an MPI message of %d bytes", n);
    rc = MPI_Recv(buf, n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        free(buf);
        return mpi_err(err, rc, "receive");
    }
    *msg = (hkv_mpi_msg){.tag = st.MPI_TAG, .src = st.MPI_SOURCE};
    memcpy(msg->hdr, buf, sizeof msg->hdr);
    msg->len = (size_t)n - sizeof msg->hdr;
    if (msg->len) {   /* the text, moved to the buffer's start and terminated */
        memmove(buf, buf + sizeof msg->hdr, msg->len);
        buf[msg->len] = 0;
        msg->text = buf;
    } else {
        free(buf);
    }
    return 1;
}

#else   /* built without MPI */

int hkv_mpi_start(hkv_mpi *m, int want, hkv_err *err) {
    *m = (hkv_mpi){0, 0, 1};
    if (want && launched() && (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")))
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "started by an MPI launcher, but this hetkv was "
                          "built without MPI (install libopenmpi-dev and rebuild), or pass "
                          "--no-mpi to run each rank as a separate job");
    return HKV_OK;
}

void hkv_mpi_stop(hkv_mpi *m, int code) { (void)m, (void)code; }

int hkv_mpi_send(hkv_mpi *m, int dst, int tag, const int64_t hdr[4], const char *text,
                 size_t len, hkv_err *err) {
    (void)m, (void)dst, (void)tag, (void)hdr, (void)text, (void)len;
    return hkv_seterr(err, HKV_E_UNSUPPORTED, "built without MPI");
}

int hkv_mpi_poll(hkv_mpi *m, int block, hkv_mpi_msg *msg, hkv_err *err) {
    (void)m, (void)block, (void)msg;
    return hkv_seterr(err, HKV_E_UNSUPPORTED, "built without MPI");
}

#endif

void hkv_mpi_msg_free(hkv_mpi_msg *msg) {
    free(msg->text);
    msg->text = NULL;
}
