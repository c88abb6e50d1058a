/* What a fork/join costs against a barrier: N empty OpenMP regions, then N
 * barriers inside one held region; best of 5. */
#include <stdio.h>
#include <omp.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
volatile int sink;
int main(){ int N=200000; double best_r=1e9,best_b=1e9;
 for(int k=0;k<5;k++){
  double t0=now(); for(int i=0;i<N;i++){
#pragma omp parallel
   { sink=omp_get_thread_num(); } }
  double t1=now();
#pragma omp parallel
  { for(int i=0;i<N;i++){ sink=omp_get_thread_num();
#pragma omp barrier
  } }
  double t2=now(); if((t1-t0)/N<best_r)best_r=(t1-t0)/N; if((t2-t1)/N<best_b)best_b=(t2-t1)/N; }
 printf("%d threads: empty region %.3f us, barrier in a held region %.3f us\n",omp_get_max_threads(),best_r*1e6,best_b*1e6);}
