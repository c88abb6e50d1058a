#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <stdint.h>
#include "kernels.h"
#include "kernels_impl.h"
static double now(void){struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc,char**argv){
  int nq=atoi(argv[1]); long p0=atol(argv[2]); int g=atoi(argv[3]), d=atoi(argv[4]);
  long nk=p0+nq; uint16_t *k=malloc(nk*d*2), *v=malloc(nk*d*2);
  for(long i=0;i<nk*d;i++){ k[i]=0x3000+(rand()&0x7ff)+((rand()&1)<<15); v[i]=0x3000+(rand()&0x7ff)+((rand()&1)<<15);} 
  float *q=malloc(sizeof(float)*nq*g*d), *o=malloc(sizeof(float)*nq*g*d), *l=malloc(sizeof(float)*nq*g);
  for(long i=0;i<(long)nq*g*d;i++) q[i]=(rand()%2001-1000)/1000.0f;
  double best=1e9; for(int rep=0;rep<5;rep++){ int it=0; double t0=now(),t; do{ FN(q,g*d,nq,g,d,p0,k,v,d,0.125f,o,g*d,l); it++; t=now(); }while(t-t0<0.2); if((t-t0)/it<best)best=(t-t0)/it; }
  double fl=4.0*g*d*((double)nq*p0+(double)nq*(nq+1)/2);
  double ck=0; for(long i=0;i<(long)nq*g*d;i++) ck+=o[i]*(1+i%5);
  printf("causal nq=%d p0=%ld g=%d d=%d: %.1f us %.1f GFLOP/s ck=%.9g\n",nq,p0,g,d,best*1e6,fl/best/1e9,ck);
}
