#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec;}
#define N 100000000L
#define F(j) "vfmadd231ps %%ymm15, %%ymm14, %%ymm" #j "\n\t"
int main(){ double t0=now(); for(long i=0;i<N;i++){ __asm__ volatile(F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11) ::: "ymm0","ymm1","ymm2","ymm3","ymm4","ymm5","ymm6","ymm7","ymm8","ymm9","ymm10","ymm11"); } double t=now()-t0; printf("12 fma chains: %.3f ns per 12 -> %.1f GFLOP/s\n", t/N*1e9, 12*16.0*N/t/1e9);
t0=now(); for(long i=0;i<N;i++){ __asm__ volatile(F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) ::: "ymm0","ymm1","ymm2","ymm3","ymm4","ymm5","ymm6","ymm7"); } t=now()-t0; printf("8 fma chains: %.3f ns per 8 -> %.1f GFLOP/s\n", t/N*1e9, 8*16.0*N/t/1e9);
t0=now(); for(long i=0;i<N;i++){ __asm__ volatile("add $1,%%rax\n\tadd $1,%%rax\n\tadd $1,%%rax\n\tadd $1,%%rax\n\t" ::: "rax"); } t=now()-t0; printf("clock ~ %.2f GHz\n", 4.0*N/t/1e9); }
