/* hetkv batch across processes with MPI (batch_mpi.c): the messages rank 0
 * (which reads the input, writes the output and decodes too) exchanges with
 * the worker ranks (which only decode). Built with Open MPI when meson finds
 * it (HKV_HAVE_MPI); without it, or when the process was not started by an
 * MPI launcher (mpirun, srun), the job is one process and nothing here is
 * called but hkv_mpi_start. */
#ifndef HKV_BATCH_MPI_H
#define HKV_BATCH_MPI_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct hkv_mpi {
    int active;      /* MPI initialised: size > 1 or a launcher started us */
    int rank, size;
} hkv_mpi;

/* The messages; each is one MPI_BYTE message: four int64 then text. */
enum {
    HKV_MPI_WANT = 1,   /* worker -> 0: hdr[0] more requests wanted */
    HKV_MPI_WORK,       /* 0 -> worker: hdr[0] input line; text: the request line */
    HKV_MPI_NOMORE,     /* 0 -> worker: the input is exhausted */
    HKV_MPI_RESULT,     /* worker -> 0: hdr[0] line, [1] 1 for an error line, [2] prompt
                           tokens, [3] generated tokens; text: the result line */
    HKV_MPI_BYE,        /* worker -> 0: every result sent; hdr[0] decode steps, [1] rows */
};

typedef struct hkv_mpi_msg {
    int tag, src;
    int64_t hdr[4];
    char *text;      /* malloc'd, NUL-terminated; NULL when the message had none */
    size_t len;
} hkv_mpi_msg;

/* MPI_Init when the process was started by an MPI launcher (Open MPI's
 * OMPI_COMM_WORLD_SIZE, PMIx's PMIX_RANK, PMI's PMI_SIZE in the environment)
 * and want is set; else m->active = 0, rank 0 of 1. An MPI launch of a
 * hetkv built without MPI is an error naming the missing package. */
int hkv_mpi_start(hkv_mpi *m, int want, hkv_err *err);
/* MPI_Finalize (code 0), or MPI_Abort(code) to end every rank of the job. */
void hkv_mpi_stop(hkv_mpi *m, int code);

int hkv_mpi_send(hkv_mpi *m, int dst, int tag, const int64_t hdr[4], const char *text,
                 size_t len, hkv_err *err);
/* The next message from any rank: 1 and *msg filled, 0 when none is waiting
 * (block = 0), negative on an MPI error. block = 1 waits for one. */
int hkv_mpi_poll(hkv_mpi *m, int block, hkv_mpi_msg *msg, hkv_err *err);
void hkv_mpi_msg_free(hkv_mpi_msg *msg);

#endif
