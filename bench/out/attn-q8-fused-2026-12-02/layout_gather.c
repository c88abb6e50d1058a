#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>
#include <sys/mman.h>
static void *hal(size_t b){ b=(b+(2<<20)-1)&~((size_t)(2<<20)-1); void*p=aligned_alloc(2<<20,b); madvise(p,b,MADV_HUGEPAGE); return p;}
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define PFD 32
int main(int argc,char**argv){
  int64_t N = 98304LL*8*8; /* rows: 8 heads x 8 layers worth, ~ */
  double dens = argc>1?atof(argv[1]):0.01;
  int8_t *kc=hal(N*128), *vc=hal(N*128);
  float *ks=hal(N*16), *vs=hal(N*16);
  uint8_t *rec=hal(N*288);
  memset(kc,1,N*128);memset(vc,1,N*128);memset(ks,1,N*16);memset(vs,1,N*16);memset(rec,1,N*288);
  int32_t *idx=malloc(N*4); int64_t n=0; uint64_t z=88172645463325252ull;
  for(int64_t r=0;r<N;r++){z^=z<<13;z^=z>>7;z^=z<<17; if((z%1000000)<dens*1e6) idx[n++]=r;}
  char *sweep=malloc(256<<20);
  for(int rep=0;rep<6;rep++){
    memset(sweep,rep,256<<20);
    double t0=now(); uint64_t s=0;
    for(int64_t i=0;i<n;i++){
      if(i+PFD<n){int64_t r=idx[i+PFD];
        _mm_prefetch((char*)kc+r*128,_MM_HINT_T1);_mm_prefetch((char*)kc+r*128+64,_MM_HINT_T1);
        _mm_prefetch((char*)vc+r*128,_MM_HINT_T1);_mm_prefetch((char*)vc+r*128+64,_MM_HINT_T1);
        _mm_prefetch((char*)(ks+r*4),_MM_HINT_T1);_mm_prefetch((char*)(vs+r*4),_MM_HINT_T1);}
      int64_t r=idx[i];
      s+=kc[r*128]+kc[r*128+64]+vc[r*128]+vc[r*128+64]+(int)ks[r*4]+(int)vs[r*4];
    }
    double t1=now();
    memset(sweep,rep+1,256<<20);
    double t2=now();
    for(int64_t i=0;i<n;i++){
      if(i+PFD<n){int64_t r=idx[i+PFD]; const char*p=(char*)rec+r*288;
        for(int o=0;o<288;o+=64)_mm_prefetch(p+o,_MM_HINT_T1); _mm_prefetch(p+287,_MM_HINT_T1);}
      int64_t r=idx[i]; const uint8_t*p=rec+r*288;
      s+=p[0]+p[64]+p[128]+p[192]+p[256]+p[287];
    }
    double t3=now();
    printf("dens %.3f rows %lld: split arrays %.1f ns/row, interleaved 288B %.1f ns/row (%llu)\n",dens,(long long)n,(t1-t0)/n*1e9,(t3-t2)/n*1e9,(unsigned long long)(s&1));
  }
}
