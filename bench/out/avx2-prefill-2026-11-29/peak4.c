#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec;}
#define N 100000000L
int buf[256] __attribute__((aligned(64)));
#define T(name, body) { double t0=now(); for(long i=0;i<N;i++){ __asm__ volatile(body : : [b]"r"(buf) : "ymm0","ymm1","ymm2","ymm3","ymm4","ymm5","ymm6","ymm7","ymm8","ymm9","ymm10","ymm11","ymm12","ymm13"); } printf("%-40s %.3f ns/iter\n", name, (now()-t0)/N*1e9); }
#define B(j,o) "vpbroadcastd " #o "(%[b]), %%ymm" #j "\n\t"
#define L(j,o) "vmovdqa " #o "(%[b]), %%ymm" #j "\n\t"
#define M(j) "vpmaddubsw %%ymm13, %%ymm12, %%ymm" #j "\n\t"
#define A(j) "vpaddw %%ymm13, %%ymm12, %%ymm" #j "\n\t"
#define F(j) "vfmadd231ps %%ymm13, %%ymm12, %%ymm" #j "\n\t"
int main(){
  T("8 bcast", B(0,0) B(1,4) B(2,8) B(3,12) B(4,16) B(5,20) B(6,24) B(7,28))
  T("8 load", L(0,0) L(1,32) L(2,64) L(3,96) L(4,128) L(5,160) L(6,192) L(7,224))
  T("8 bcast + 8 load", B(0,0) B(1,4) B(2,8) B(3,12) B(4,16) B(5,20) B(6,24) B(7,28) L(8,0) L(9,32) L(10,64) L(11,96) L(8,128) L(9,160) L(10,192) L(11,224))
  T("8 maddubs", M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7))
  T("8 maddubs + 8 paddw", M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) A(8) A(9) A(10) A(11) A(8) A(9) A(10) A(11))
  T("8 maddubs + 4 fma", M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) F(8) F(9) F(10) F(11))
  T("8 maddubs + 8 paddw + 4 fma", M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) A(8) A(9) A(10) A(11) A(8) A(9) A(10) A(11) F(0) F(1) F(2) F(3))
  T("8 maddubs + 8 bcast + 8 paddw", M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) A(8) A(9) A(10) A(11) A(8) A(9) A(10) A(11) B(0,0) B(1,4) B(2,8) B(3,12) B(4,16) B(5,20) B(6,24) B(7,28))
  T("8 maddubs + 8 bcast + 8 load", M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) B(0,0) B(1,4) B(2,8) B(3,12) B(4,16) B(5,20) B(6,24) B(7,28) L(8,0) L(9,32) L(10,64) L(11,96) L(8,128) L(9,160) L(10,192) L(11,224))
  return 0;
}
