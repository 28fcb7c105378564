// Cost of setting the client-side TCP options of `tcp = { … }` on every accepted socket, the
// alternative to setting them once on the listener (what Fulcrum does: accepted sockets inherit).
// cc -O2 bench/setsockopt_cost.c -o /tmp/setsockopt_cost && taskset -c 0 /tmp/setsockopt_cost
#include <stdio.h>
#include <time.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(){
  int L=socket(AF_INET,SOCK_STREAM,0); struct sockaddr_in a={0}; a.sin_family=AF_INET; a.sin_addr.s_addr=htonl(0x7f000001);
  bind(L,(void*)&a,sizeof a); listen(L,128); socklen_t al=sizeof a; getsockname(L,(void*)&a,&al);
  int c=socket(AF_INET,SOCK_STREAM,0); connect(c,(void*)&a,sizeof a); int s=accept(L,0,0);
  int N=200000, one=1, v;
  double t0=now();
  for(int i=0;i<N;i++){
    setsockopt(s,IPPROTO_TCP,TCP_CONGESTION,"bbr",3);
    setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,4);
    v=16384; setsockopt(s,IPPROTO_TCP,TCP_NOTSENT_LOWAT,&v,4);
    setsockopt(s,SOL_SOCKET,SO_KEEPALIVE,&one,4);
    v=60; setsockopt(s,IPPROTO_TCP,TCP_KEEPIDLE,&v,4);
    v=10; setsockopt(s,IPPROTO_TCP,TCP_KEEPINTVL,&v,4);
    v=6; setsockopt(s,IPPROTO_TCP,TCP_KEEPCNT,&v,4);
    v=262144; setsockopt(s,SOL_SOCKET,SO_SNDBUF,&v,4);
    v=524288; setsockopt(s,SOL_SOCKET,SO_RCVBUF,&v,4);
  }
  double t1=now();
  for(int i=0;i<N;i++) setsockopt(s,IPPROTO_TCP,TCP_CONGESTION,"bbr",3);
  double t2=now();
  for(int i=0;i<N;i++) setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,4);
  double t3=now();
  printf("9 setsockopt (all options): %.0f ns per connection; TCP_CONGESTION alone %.0f ns; TCP_NODELAY alone %.0f ns\n",(t1-t0)/N,(t2-t1)/N,(t3-t2)/N);
}
