/* Minimal test harness for the gguf tests: a table of named cases (libuv
 * test-list style); `prog` runs all, `prog NAME...` runs the named ones.
 * CHECK records a failure with file:line and returns from the case. */
#ifndef HKV_TEST_TCASE_H
#define HKV_TEST_TCASE_H

#include <stdio.h>
#include <string.h>

typedef struct tcase {
    const char *name;
    int (*fn)(void); /* 0 = pass, 1 = fail */
} tcase;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, \
                    #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            return 1;                                                         \
        }                                                                     \
    } while (0)

static inline int tcase_run(const tcase *cases, int n, int argc, char **argv) {
    int failed = 0, ran = 0;
    for (int i = 0; i < n; i++) {
        int want = argc <= 1;
        for (int a = 1; a < argc; a++) want |= strcmp(argv[a], cases[i].name) == 0;
        if (!want) continue;
        ran++;
        int rc = cases[i].fn();
        printf("%s %s\n", rc ? "FAIL" : "ok  ", cases[i].name);
        failed += rc != 0;
    }
    if (ran == 0) {
        fprintf(stderr, "no test case matched\n");
        return 1;
    }
    printf("%d/%d cases passed\n", ran - failed, ran);
    return failed ? 1 : 0;
}

#endif
