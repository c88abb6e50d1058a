#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(void){struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec;}
static inline __m256i dp(__m256i acc, __m256i a, __m256i b){ __m256i t=_mm256_madd_epi16(a,b); __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(t)); return acc;}
/* madd with a memory operand, add in place */
#define DPM(acc, kb, ptr) do { __m256i t_; __asm__("vpmaddwd %1, %2, %0" : "=x"(t_) : "m"(*(const __m256i*)(ptr)), "x"(kb)); __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(t_)); } while(0)
_Alignas(64) int32_t K[32*64*8], Q[64*48];
int main(){
  for(int i=0;i<32*64*8;i++) K[i]=i*7; for(int i=0;i<64*48;i++) Q[i]=i*3;
  long reps=200000;
  for(int mode=0;mode<3;mode++){
    double t0=now(); __m256i sink=_mm256_setzero_si256(); long madds=0;
    for(long r=0;r<reps;r++){
      if(mode==0){
      __m256i acc[4][2]; for(int a=0;a<4;a++)for(int b=0;b<2;b++)acc[a][b]=_mm256_setzero_si256();
      for(int c2=0;c2<32;c2++){
        __m256i q0=_mm256_load_si256((void*)(Q+c2*48)), q1=_mm256_load_si256((void*)(Q+c2*48+8));
        for(int jj=0;jj<4;jj++){ __m256i kb = _mm256_set1_epi32(K[jj*32+c2]);
          acc[jj][0]=dp(acc[jj][0],q0,kb); acc[jj][1]=dp(acc[jj][1],q1,kb); }
      }
      for(int a=0;a<4;a++)for(int b=0;b<2;b++) sink=_mm256_xor_si256(sink,acc[a][b]);
      madds+=32*8;
      } else if (mode==1) {
      __m256i acc[4][3]; for(int a=0;a<4;a++)for(int b=0;b<3;b++)acc[a][b]=_mm256_setzero_si256();
      for(int c2=0;c2<32;c2++){
        const int32_t *qp=Q+c2*48;
        for(int jj=0;jj<4;jj++){ __m256i kb = _mm256_set1_epi32(K[jj*32+c2]);
          DPM(acc[jj][0],kb,qp); DPM(acc[jj][1],kb,qp+8); DPM(acc[jj][2],kb,qp+16); }
      }
      for(int a=0;a<4;a++)for(int b=0;b<3;b++) sink=_mm256_xor_si256(sink,acc[a][b]);
      madds+=32*12;
      } else {
      __m256i acc[2][6]; for(int a=0;a<2;a++)for(int b=0;b<6;b++)acc[a][b]=_mm256_setzero_si256();
      for(int c2=0;c2<32;c2++){
        const int32_t *qp=Q+c2*48;
        for(int jj=0;jj<2;jj++){ __m256i kb = _mm256_set1_epi32(K[jj*32+c2]);
          for(int u=0;u<6;u++) DPM(acc[jj][u],kb,qp+8*u); }
      }
      for(int a=0;a<2;a++)for(int b=0;b<6;b++) sink=_mm256_xor_si256(sink,acc[a][b]);
      madds+=32*12;
      }
      __asm__ volatile("" :: "x"(sink));
    }
    double t=now()-t0; printf("mode %d: %.2f G madd/s\n", mode, madds/t/1e9);
  }
}
