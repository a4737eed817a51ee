#include <immintrin.h>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <ctime>
static double now(){timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
alignas(64) static uint8_t U[4096];
alignas(64) static uint8_t X[16*320];
alignas(64) static float ACC[16*16];
static const long XS = 292;

template<int R, int MODE>
__attribute__((noinline)) void block(const uint8_t* u, const uint8_t* x, const __m512* sc, float* acc){
  __m512 isum[R];
  for(int m=0;m<R;++m) isum[m]=_mm512_setzero_ps();
  for(int p=0;p<4;++p){
    __m512i c[R][2];
    for(int m=0;m<R;++m) c[m][0]=c[m][1]=_mm512_setzero_si512();
    for(int r=0;r<8;++r){
      __m512i q0=_mm512_load_si512(u+1024*p+64*r), q1=_mm512_load_si512(u+1024*p+512+64*r);
      for(int m=0;m<R;++m){
        const uint8_t* xp = x + m*XS + 64*p + 4*r;
        if constexpr (MODE==1) {
          __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(c[m][0]) : "v"(q0), "m"(*(const int32_t*)xp));
          __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(c[m][1]) : "v"(q1), "m"(*(const int32_t*)(xp+32)));
        } else {
          int32_t lo,hi; memcpy(&lo,xp,4); memcpy(&hi,xp+32,4);
          c[m][0]=_mm512_dpbusd_epi32(c[m][0],q0,_mm512_set1_epi32(lo));
          c[m][1]=_mm512_dpbusd_epi32(c[m][1],q1,_mm512_set1_epi32(hi));
        }
      }
    }
    for(int m=0;m<R;++m){
      if constexpr (MODE==2) { isum[m]=_mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(isum[m]), _mm512_add_epi32(c[m][0],c[m][1]))); }
      else {
      isum[m]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(c[m][0]),sc[2*p],isum[m]);
      isum[m]=_mm512_fmadd_ps(_mm512_cvtepi32_ps(c[m][1]),sc[2*p+1],isum[m]);
      }
    }
  }
  for(int m=0;m<R;++m) _mm512_store_ps(acc+16*m,_mm512_add_ps(_mm512_load_ps(acc+16*m),isum[m]));
}
static double clock_ghz(){ long N=20000000; uint64_t x=3; double t0=now();
  for(long i=0;i<N;i++){ __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(x)); }
  return 12.0*N/(now()-t0)*1e-9; }
template<int R,int MODE> void run(const char* name, double ghz){
  __m512 sc[8]; for(int j=0;j<8;++j) sc[j]=_mm512_set1_ps(1.0f+j);
  long N=400000/R; double best=1e9;
  for(int rep=0;rep<5;++rep){ double t0=now(); for(long i=0;i<N;++i) block<R,MODE>(U,X,sc,ACC); double t=now()-t0; if(t<best)best=t; }
  double macs = 16.0*256*R*N; printf("%-28s R=%2d  %.1f MAC/cycle  (%.0f cycles/record pass)\n", name, R, macs/(best*ghz*1e9), best*ghz*1e9/N);
}
int main(){ for(int i=0;i<(int)sizeof(U);++i)U[i]=i*7; for(int i=0;i<(int)sizeof(X);++i)X[i]=i*3;
  double g=clock_ghz(); printf("clock %.2f GHz (128 MAC/cycle = 2 vpdpbusd)\n",g);
  run<8,0>("intrinsics, float sums",g); run<8,1>("embedded bcast, float sums",g); run<8,2>("intrinsics, int add only",g);
  run<4,0>("intrinsics, float sums",g); run<4,1>("embedded bcast, float sums",g);
  run<8,0>("intrinsics, float sums",g); run<8,1>("embedded bcast, float sums",g);
}
