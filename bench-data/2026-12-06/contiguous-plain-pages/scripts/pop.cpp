#include <sys/mman.h>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <unistd.h>
static const size_t PAGE=4096, HUGE=2<<20;
void report(const char* what, uint8_t* p, size_t bytes){ FILE* pm=fopen("/proc/self/pagemap","rb"); FILE* kf=fopen("/proc/kpageflags","rb"); size_t n=0,thp=0,contig=0; uint64_t prev=0;
  for(size_t i=0;i<bytes/PAGE;i++){ uint64_t v=0; fseek(pm,((uintptr_t)p/PAGE+i)*8,SEEK_SET); if(fread(&v,8,1,pm)!=1||!(v>>63)){prev=0;continue;} uint64_t pfn=v&((1ULL<<55)-1), fl=0; fseek(kf,pfn*8,SEEK_SET); if(fread(&fl,8,1,kf)!=1) continue; n++; if(fl&((1ULL<<15)|(1ULL<<16))) thp++; if(prev&&pfn==prev+1) contig++; prev=pfn; }
  printf("%-28s present %zu compound %zu mean run %.1f\n", what, n, thp, n/(double)(n-contig+1)); fclose(pm); fclose(kf); }
int main(int argc, char** argv){ size_t bytes = (argc>1?atol(argv[1]):256)<<20;
  uint8_t* raw=(uint8_t*)mmap(0,bytes+HUGE,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0); uint8_t* p=(uint8_t*)(((uintptr_t)raw+HUGE-1)/HUGE*HUGE);
  madvise(p,bytes,MADV_HUGEPAGE); for(size_t o=0;o<bytes;o+=HUGE) madvise(p+o,HUGE,23); report("THP populated", p, bytes);
  for(size_t o=0;o<bytes;o+=PAGE) p[o]=1; for(size_t o=0;o<bytes;o+=HUGE) madvise(p+o+PAGE,HUGE-PAGE,20); report("touched, MADV_COLD partial", p, bytes);
  for(size_t o=0;o<bytes;o+=HUGE) madvise(p+o,HUGE,MADV_NOHUGEPAGE); sleep(5); report("5 s later", p, bytes);
  uint8_t* q=(uint8_t*)mmap(0,bytes,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0); madvise(q,bytes,MADV_NOHUGEPAGE);
  for(size_t o=0;o<bytes;o+=HUGE) madvise(q+o,HUGE,23); report("plain, 2 MiB populates", q, bytes);
  uint8_t* r=(uint8_t*)mmap(0,bytes,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0); madvise(r,bytes,MADV_NOHUGEPAGE);
  for(size_t o=0;o<bytes;o+=162*PAGE) madvise(r+o,std::min<size_t>(162*PAGE,bytes-o),23); report("plain, 162-page populates", r, bytes);
  return 0; }
