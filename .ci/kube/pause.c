/* The pod sandbox's "pause" process for the test cluster: it holds the pod's namespaces
 * and reaps the orphans that end up with it, until it is told to stop. Built static, so
 * its image holds nothing else (no registry is reachable to fetch the usual one). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction end = {.sa_handler = stop}, child = {.sa_handler = reap};
  sigaction(SIGINT, &end, NULL);
  sigaction(SIGTERM, &end, NULL);
  child.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
}
