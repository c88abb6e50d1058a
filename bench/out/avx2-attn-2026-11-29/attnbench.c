/* single-thread attention kernel timings, thread CPU time, median of reps */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include "kernels.h"
#include "isa.h"
static double now(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static uint64_t st=88172645463325252ull;
static uint64_t rnd(void){st^=st<<13;st^=st>>7;st^=st<<17;return st;}
int main(int argc,char**argv){
  int isa=hkv_isa_parse(argc>1?argv[1]:"avx2"); int reps=argc>2?atoi(argv[2]):15; const char*only=argc>3?argv[3]:0;
  hkv_cpu_kernels t; if(hkv_cpu_kernels_init(&t,isa)<0) return 1;
  const int64_t CR=32768;
  uint16_t *k=malloc(CR*128*2),*v=malloc(CR*128*2);
  float *tmp=malloc(CR*128*4);
  for(int64_t i=0;i<CR*128;i++) tmp[i]=((int)(rnd()%2001)-1000)/1000.0f;
  t.f32_to_f16(tmp,k,CR*128);
  for(int64_t i=0;i<CR*128;i++) tmp[i]=((int)(rnd()%2001)-1000)/1000.0f;
  t.f32_to_f16(tmp,v,CR*128);
  int32_t *idx=malloc(8192*4); for(int i=0;i<8192;i++) idx[i]=rnd()%CR;
  int8_t *k8=malloc(CR*128); for(int64_t i=0;i<CR*128;i++) k8[i]=(int8_t)(rnd()%255-127);
  float *sc8=malloc(CR*4*4); for(int64_t i=0;i<CR*4;i++) sc8[i]=(rnd()%1000+1)*1e-4f;
  int32_t *seq=malloc(8192*4); for(int i=0;i<8192;i++) seq[i]=i;
  float q[64*128*4]; for(int i=0;i<64*128*4;i++) q[i]=((int)(rnd()%2001)-1000)/2000.0f;
  float out[64*128*4], lse[1024], s[8192];
  struct {const char*name;int kern,g,d;int64_t n;int calls;} cs[]={
    {"dense hot 64x(g3 d64 n1024)",0,3,64,1024,64},
    {"dense hot 16x(g1 d64 n1024)",0,1,64,1024,16},
    {"dense hot 16x(g8 d64 n1024)",0,8,64,1024,16},
    {"dense hot 16x(g4 d128 n1024)",0,4,128,1024,16},
    {"dense hot 16x(g2 d128 n1024)",0,2,128,1024,16},
    {"dense hot 16x(g7 d64 n1024)",0,7,64,1024,16},
    {"dense hot 16x(g7 d128 n1024)",0,7,128,1024,16},
    {"sparse 32K 16x(g4 d128 n1024)",1,4,128,1024,16},
    {"sparse 32K 16x(g3 d64 n4096)",1,3,64,4096,16},
    {"score_max 32K 16x(g4 d128 n4096)",2,4,128,4096,16},
    {"score_max 32K 16x(g3 d64 n4096)",2,3,64,4096,16},
    {"score_max seq 64x(g3 d64 n1024)",3,3,64,1024,64},
    {"score_max seq 16x(g8 d128 n1024)",3,8,128,1024,16},
    {"score_max seq 16x(g7 d128 n1024)",3,7,128,1024,16},
    {"score_max seq 16x(g8 d64 n1024)",3,8,64,1024,16},
    {"score_max seq 16x(g5 d128 n1024)",3,5,128,1024,16},
    {"sparse 32K 16x(g8 d128 n1024)",1,8,128,1024,16},
    {"score_i8 32K 16x(g4 d128 n4096)",4,4,128,4096,16},
    {"score_i8 32K 16x(g8 d128 n4096)",4,8,128,4096,16},
    {"score_i8 32K 16x(g3 d64 n4096)",4,3,64,4096,16},
    {"score_i8 32K 16x(g7 d128 n4096)",4,7,128,4096,16},
    {"sparse 32K 16x(g8 d64 n1024)",1,8,64,1024,16},
  };
  for(unsigned c=0;c<sizeof cs/sizeof*cs;c++){
    double tt[1001]; int d=cs[c].d,g=cs[c].g; if(only&&!strstr(cs[c].name,only)) continue;
    for(int i=0;i<cs[c].calls;i++) t.attn_dense(q,g,d,k,v,d,cs[c].n,0.125f,out,lse);
    for(int r=0;r<reps;r++){
      double t0=now();
      for(int i=0;i<cs[c].calls;i++){
        if(cs[c].kern==0) t.attn_dense(q+(i%4)*g*d,g,d,k,v,d,cs[c].n,0.125f,out,lse);
        else if(cs[c].kern==1) t.attn_sparse(q+(i%4)*g*d,g,d,k,v,d,idx,cs[c].n,0.125f,out,lse);
        else if(cs[c].kern==4) t.score_max_i8(q+(i%4)*g*d,g,d,k8,d,sc8,idx,cs[c].n,s);
        else if(cs[c].kern==2) t.score_max(q+(i%4)*g*d,g,d,k,d,idx,cs[c].n,s);
        else t.score_max(q+(i%4)*g*d,g,d,k,d,seq,cs[c].n,s);
      }
      tt[r]=now()-t0;
    }
    qsort(tt,reps,sizeof*tt,cmp);
    printf("%-36s %s  median %8.1f us  min %8.1f us  (%.2f ns/row)\n",cs[c].name,hkv_isa_name(isa),tt[reps/2]*1e6,tt[0]*1e6,tt[reps/2]*1e9/(cs[c].calls*cs[c].n));
  }
  return (int)out[0]*0;
}
