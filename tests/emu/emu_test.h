/* Shared by the tests of the CUDA emulator itself (gpu/emu/, -Dgpu_emu=true):
 * check counting in the style of tests/cpu/util.h, CUDA status checks, and
 * capture of what the emulator prints on stderr around a call (its fault
 * reports), so a test can check that a report names the kernel.
 *
 * Every expected value in these tests comes from the documented semantics
 * (CUDA C++ Programming Guide, CUDA Runtime API, PTX ISA, cuBLAS), computed on
 * the host with code of the test's own, never from the emulator's helpers. */
#ifndef HKV_TEST_EMU_H
#define HKV_TEST_EMU_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>

#include "gpu_internal.cuh"

static int test_failures __attribute__((unused));
static int test_checks __attribute__((unused));

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        test_checks++;                                                           \
        if (!(cond)) {                                                           \
            test_failures++;                                                     \
            if (test_failures <= 40) {                                           \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);            \
                fprintf(stderr, __VA_ARGS__);                                    \
                fputc('\n', stderr);                                             \
            }                                                                    \
        }                                                                        \
    } while (0)

/* A call that must return cudaSuccess. */
#define CUDA_OK(call)                                                                 \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        CHECK(e_ == cudaSuccess, "%s returned %s", #call, cudaGetErrorName(e_));      \
    } while (0)

/* A call that must return exactly `want`. */
#define CUDA_IS(want, call)                                                           \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        CHECK(e_ == (want), "%s returned %s, want %s", #call, cudaGetErrorName(e_),  \
              cudaGetErrorName(want));                                                \
    } while (0)

static inline int test_report(const char *name)
{
    printf("%s: %d checks, %d failures\n", name, test_checks, test_failures);
    return test_failures ? 1 : 0;
}

/* What the process writes to fd 2 between begin() and end(). */
struct stderr_capture {
    int saved = -1;
    FILE *tmp = nullptr;
    void begin()
    {
        fflush(stderr);
        tmp = tmpfile();
        if (!tmp) return;
        saved = dup(2);
        dup2(fileno(tmp), 2);
    }
    std::string end()
    {
        std::string out;
        if (!tmp) return out;
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        saved = -1;
        rewind(tmp);
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, tmp)) > 0) out.append(buf, n);
        fclose(tmp);
        tmp = nullptr;
        /* shown in the log too, marked as expected */
        if (!out.empty()) fprintf(stderr, "[expected emulator report] %s", out.c_str());
        return out;
    }
};

static inline bool has(const std::string &s, const char *what) { return s.find(what) != std::string::npos; }

#endif
