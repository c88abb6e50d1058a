/* Stop signals in the CLI. SIGINT and SIGTERM are blocked in every thread of
 * a command (the mask is set before the engine starts its OpenMP and oneDNN
 * workers, which inherit it) and taken between steps: no handler ever runs
 * on a thread in the middle of a kernel (one delivered to a oneDNN sgemm
 * worker was seen to corrupt the heap), and no global flag is needed. */
#include <time.h>

#include "cli.h"

void hkv_cli_block_stop_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, set, NULL);
}

int hkv_cli_signal_pending(const sigset_t *set) {
    const struct timespec zero = {0, 0};
    const int sig = sigtimedwait(set, NULL, &zero);
    return sig > 0 ? sig : 0;
}
