#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <sys/mman.h>
static void *hal(size_t b){ b=(b+(2<<20)-1)&~((size_t)(2<<20)-1); void*p=aligned_alloc(2<<20,b); madvise(p,b,MADV_HUGEPAGE); return p;}
typedef void q8fn(const float *q, int g, int d, const int8_t *k, const float *ks,
                        const int8_t *v, const float *vs, int64_t ld, const int32_t *idx, int64_t n,
                        float scale, float *out, float *lse);
q8fn hkv_attn_q8_avx512, hkv_attn_q8_B;
void hkv_attn_sparse_B(const float *q, int g, int d, const uint16_t *k, const uint16_t *v, int64_t ld, const int32_t *idx, int64_t n, float scale, float *out, float *lse);
void hkv_attn_sparse_avx512(const float *q, int g, int d, const uint16_t *k, const uint16_t *v,
                            int64_t ld, const int32_t *idx, int64_t n, float scale, float *out, float *lse);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  const int d=128,g=4; const int64_t N=98304*16; const int64_t sel=argc>1?atol(argv[1]):1024;
  const int heads=argc>2?atoi(argv[2]):64; const int reps=argc>3?atoi(argv[3]):15;
  int8_t *kc=hal(N*d), *vc=hal(N*d);
  float *ks=hal(N*4*4), *vs=hal(N*4*4);
  uint16_t *k16=hal(N*d*2), *v16=hal(N*d*2);
  for(int64_t i=0;i<N*d;i++){kc[i]=(int8_t)(i*7); vc[i]=(int8_t)(i*13); k16[i]=0x3c00^(i&0xff); v16[i]=0x3800^(i&0xff);}
  for(int64_t i=0;i<N*4;i++){ks[i]=0.01f*(1+(i%5)); vs[i]=0.02f;}
  float q[512], out[512], lse[4], outB[512], lseB[4]; for(int i=0;i<512;i++) q[i]=(i%7)*0.1f-0.3f;
  const int64_t per=N/heads;
  int32_t *idx=malloc(sizeof(int32_t)*sel*heads); uint64_t z=88172645463325252ull;
  for(int h=0;h<heads;h++){ int64_t c=0; for(int64_t r=0;r<per&&c<sel;r++){ z^=z<<13;z^=z>>7;z^=z<<17; if((z%per)<(uint64_t)(sel*1.05)) idx[h*sel+c++]=(int32_t)(h*per+r);} for(;c<sel;c++) idx[h*sel+c]=(int32_t)(h*per+per-1-(sel-c)); }
  /* same bits */
  hkv_attn_q8_avx512(q,g,d,kc,ks,vc,vs,d,idx,sel,0.088f,out,lse);
  hkv_attn_q8_B(q,g,d,kc,ks,vc,vs,d,idx,sel,0.088f,outB,lseB);
  int same = !memcmp(out,outB,sizeof out) && !memcmp(lse,lseB,sizeof lse);
  char *sw=malloc(128<<20);
  double best[3]={1e9,1e9,1e9};
  for(int rep=0;rep<reps;rep++){
    for(int v=0; v<3; v++){
      memset(sw,rep+v,128<<20);
      double t0=now();
      for(int h=0;h<heads;h++){
        if(v==0) hkv_attn_q8_avx512(q,g,d,kc,ks,vc,vs,d,idx+h*sel,sel,0.088f,out,lse);
        else if(v==1) hkv_attn_sparse_B(q,g,d,k16,v16,d,idx+h*sel,sel,0.088f,out,lse);
        else hkv_attn_sparse_avx512(q,g,d,k16,v16,d,idx+h*sel,sel,0.088f,out,lse);
      }
      double t=(now()-t0)/(heads*sel)*1e9; if(t<best[v]) best[v]=t;
    }
  }
  printf("sel %lld: q8 new %.1f  f16 old %.1f  f16 new %.1f ns/row; f16 new/old %.3f\n",(long long)sel,best[0],best[1],best[2],best[2]/best[1]);
}
