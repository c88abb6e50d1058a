/* The check most C tests count their failures with: CHECK(cond, fmt, ...)
 * prints "FAIL file:line: message" on stdout and counts it in `fails`; the
 * test's main returns fails != 0. (The cpu/ and emu/ tests count checks too
 * and cap their output: tests/cpu/util.h, tests/emu/emu_test.h; the gguf
 * cases return at their first failure: tests/gguf/tcase.h.) */
#ifndef HKV_TEST_CHECK_H
#define HKV_TEST_CHECK_H

#include <stdio.h>

static int fails = 0;
#define CHECK(c, ...)                                   \
    do {                                                \
        if (!(c)) {                                     \
            fails++;                                    \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
        }                                               \
    } while (0)

#endif
