// Microbench: 2 threads streaming expert slices through (A) a mirror of mremap'd pool pages (as the engine)
// and (B) one malloc'd buffer written in order (as llama.cpp's repack buffer). Same virtual layout.
#include <sys/mman.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
static const size_t PAGE = 4096, HUGE = 2 << 20;
static const int L = 22, E = 64, K = 8, T = 3;
static size_t SLICE = 663552 + 32;  // not a page multiple, like the file
static size_t OFF0 = 32;            // 32 mod 64, like the gguf
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif
struct Barrier { std::atomic<int> n{0}, gen{0}; void wait(int nt){ int g=gen.load(); if(n.fetch_add(1)+1==nt){n=0;gen.fetch_add(1);} else while(gen.load()==g) _mm_pause(); } };
static inline __m256i sum_range(const uint8_t* p, size_t n, __m256i acc){
  const uint8_t* e = p + n; for(; p + 32 <= e; p += 32) acc = _mm256_add_epi64(acc, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i*)p), _mm256_setzero_si256())); return acc; }
int main(int argc, char** argv){
  int tokens = argc>1?atoi(argv[1]):40, rounds = argc>2?atoi(argv[2]):10; int nt = 2;
  char mode = argc>3 ? argv[3][0] : 'r'; bool seq_pool = mode=='s' || mode=='c';
  size_t total = OFF0 + SLICE * (size_t)L*E*T; size_t mirror_bytes = (total + PAGE-1)/PAGE*PAGE;
  // B: one buffer, written in order
  uint8_t* B = (uint8_t*)aligned_alloc(64, mirror_bytes); for(size_t i=0;i<mirror_bytes;i+=64) memset(B+i, (int)(i>>12), 64);
  // A: mirror reserve + pool of THP chunks; slices mapped in random (routing) order
  uint8_t* M = (uint8_t*)mmap(nullptr, mirror_bytes, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE, -1, 0);
  size_t pool_bytes = mirror_bytes + 64*HUGE; uint8_t* praw = (uint8_t*)mmap(nullptr, pool_bytes + HUGE, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE, -1, 0);
  uint8_t* P = (uint8_t*)(((uintptr_t)praw + HUGE-1)/HUGE*HUGE); madvise(P, pool_bytes, (mode=='n'||mode=='f') ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
  size_t pool_used = 0, pool_pop = 0; std::vector<char> mapped(mirror_bytes/PAGE, 0);
  std::vector<int> order(L*E*T); for(int i=0;i<L*E*T;i++) order[i]=i; std::mt19937 rng(1); if(!seq_pool) std::shuffle(order.begin(), order.end(), rng);
  std::vector<size_t> runs; const size_t RUNP = argc>4?atoi(argv[4]):32, RUN=RUNP*PAGE; if(mode=='f'){ size_t nr=pool_bytes/RUN; for(size_t i=0;i<nr;i++) runs.push_back(i*RUN); std::shuffle(runs.begin(), runs.end(), rng); madvise(P, pool_bytes, 23); }
  if(mode=='i'){ size_t R = argc>4?atoi(argv[4]):8; madvise(M, mirror_bytes, MADV_NOHUGEPAGE); std::vector<size_t> g; for(size_t i=0;i<mirror_bytes/PAGE;i+=R) g.push_back(i); std::shuffle(g.begin(), g.end(), rng); for(size_t s0: g) for(size_t k=s0;k<std::min(s0+R, mirror_bytes/PAGE);k++) M[k*PAGE]=1; order.clear(); }
  for(int s: order){ size_t a = OFF0 + s*SLICE, b = a + SLICE; size_t u0 = a/PAGE, u1 = (b+PAGE-1)/PAGE;
    size_t first=u0; while(first<u1 && mapped[first]) first++; size_t last=u1; while(last>first && mapped[last-1]) last--; if(first>=last) continue;
    size_t bytes=(last-first)*PAGE; while(pool_pop < pool_used+bytes){ madvise(P+pool_pop, HUGE, 23/*POPULATE_WRITE*/); if(mode=='x') madvise(P+pool_pop+PAGE, HUGE-PAGE, 20); madvise(P+pool_pop, HUGE, MADV_NOHUGEPAGE); pool_pop+=HUGE; }
    if(mode=='f'){ for(size_t u=first;u<last;){ size_t r=runs.back(); runs.pop_back(); size_t n=std::min<size_t>(RUNP,last-u); if(mremap(P+r, n*PAGE, n*PAGE, MREMAP_MAYMOVE|MREMAP_FIXED, M+u*PAGE)==MAP_FAILED){perror("mremap f");return 1;} u+=n;} for(size_t u=first;u<last;u++) mapped[u]=1; continue; }
    if(mode=='c'){ pool_used = first*PAGE; while(pool_pop < pool_used+bytes){ madvise(P+pool_pop, HUGE, 23); madvise(P+pool_pop, HUGE, MADV_NOHUGEPAGE); pool_pop+=HUGE; } }
    if(mremap(P+pool_used, bytes, bytes, MREMAP_MAYMOVE|MREMAP_FIXED|MREMAP_DONTUNMAP, M+first*PAGE)==MAP_FAILED){perror("mremap");return 1;}
    for(size_t u=first;u<last;u++) mapped[u]=1; pool_used+=bytes; }
  for(size_t i=0;i<mirror_bytes;i+=64) memcpy(M+i, B+i, 64);
  if(memcmp(M,B,mirror_bytes)){puts("mismatch");return 1;}
  { FILE* pm=fopen("/proc/self/pagemap","rb"); FILE* kf=fopen("/proc/kpageflags","rb"); size_t n=0, thp=0, contig=0; uint64_t prev=0;
    for(size_t i=0;i<mirror_bytes/PAGE;i+=1){ uint64_t v=0; fseek(pm, ((uintptr_t)M/PAGE+i)*8, SEEK_SET); if(fread(&v,8,1,pm)!=1||!(v>>63)) {prev=0; continue;} uint64_t pfn=v&((1ULL<<55)-1); uint64_t fl=0; fseek(kf,pfn*8,SEEK_SET); if(fread(&fl,8,1,kf)!=1) continue; n++; if(fl&((1ULL<<15)|(1ULL<<16))) thp++; if(prev && pfn==prev+1) contig++; prev=pfn; }
    printf("mirror pages %zu compound %zu mean run %.1f\n", n, thp, n/(double)(n-contig+1)); fflush(stdout); fclose(pm); fclose(kf); }
  // routing: uniform top-8 per layer per token
  std::vector<int> route(tokens*L*K); for(auto& r: route) r = 0; 
  for(int t=0;t<tokens;t++) for(int l=0;l<L;l++){ std::vector<int> ex(E); for(int i=0;i<E;i++) ex[i]=i; std::shuffle(ex.begin(), ex.end(), rng); for(int k=0;k<K;k++) route[(t*L+l)*K+k]=ex[k]; }
  Barrier bar; std::atomic<int> go{0}; std::atomic<uint8_t*> base{nullptr}; std::atomic<long> sink{0};
  auto work = [&](int tid){ int seen=0; for(;;){ while(go.load()==seen) _mm_pause(); if(go.load()<0) return; seen++; uint8_t* bs=base.load(); __m256i acc=_mm256_setzero_si256();
      for(int t=0;t<tokens;t++) for(int l=0;l<L;l++) for(int tt=0;tt<T;tt++){ for(int k=0;k<K;k++){ int e=route[(t*L+l)*K+k]; const uint8_t* s = bs + OFF0 + ((size_t)(l*T+tt)*E + e)*SLICE; size_t half=SLICE/2/64*64; acc = tid==0? sum_range(s, half, acc) : sum_range(s+half, SLICE-half, acc);} bar.wait(nt);} 
      sink += _mm256_extract_epi64(acc,0); bar.wait(nt); } };
  std::thread th(work, 1);
  auto run = [&](uint8_t* bs){ base=bs; auto t0=std::chrono::steady_clock::now(); go.fetch_add(1);
    // main thread is tid 0
    __m256i acc=_mm256_setzero_si256(); for(int t=0;t<tokens;t++) for(int l=0;l<L;l++) for(int tt=0;tt<T;tt++){ for(int k=0;k<K;k++){ int e=route[(t*L+l)*K+k]; const uint8_t* s = bs + OFF0 + ((size_t)(l*T+tt)*E + e)*SLICE; size_t half=SLICE/2/64*64; acc=sum_range(s, half, acc);} bar.wait(nt);} 
    sink += _mm256_extract_epi64(acc,0); bar.wait(nt);
    return std::chrono::duration<double,std::milli>(std::chrono::steady_clock::now()-t0).count()/tokens; };
  // the worker waits on go changing; simplify: worker loop handles one job per go increment
  for(int r=0;r<rounds;r++){ double a=run(M), b=run(B); printf("round %d mirror %.3f ms/token buffer %.3f  buffer/mirror %.3f\n", r, a, b, b/a); fflush(stdout);} 
  go.store(-1000000); th.detach(); printf("sink %ld\n", (long)sink); return 0; }
