#define _GNU_SOURCE
#include <sys/mman.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static double rd(uint8_t*p,size_t n){double t=now();uint64_t a=0;for(size_t k=0;k<n/8;k+=8)a+=((uint64_t*)p)[k];volatile uint64_t x=a;(void)x;return (now()-t)*1000;}
int main(int argc,char**argv){
  size_t n=512UL<<20; int idle=atoi(argv[1]);
  uint8_t*raw=mmap(0,n+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  uint8_t*a=(uint8_t*)(((uintptr_t)raw+(2<<20)-1)/(2<<20)*(2<<20)); madvise(a,n,MADV_HUGEPAGE); memset(a,1,n);
  int fd=memfd_create("x",0); ftruncate(fd,n); uint8_t*b=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_POPULATE,fd,0); memset(b,1,n);
  uint8_t*c=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); madvise(c,n,MADV_NOHUGEPAGE); memset(c,1,n);
  printf("warm: thp %.0f memfd %.0f anon4k %.0f ms\n",rd(a,n),rd(b,n),rd(c,n));
  sleep(idle);
  printf("after %ds idle: thp %.0f ",idle,rd(a,n)); printf("memfd %.0f ",rd(b,n)); printf("anon4k %.0f ms\n",rd(c,n));
  printf("again: thp %.0f memfd %.0f anon4k %.0f ms\n",rd(a,n),rd(b,n),rd(c,n));
  return 0;}
