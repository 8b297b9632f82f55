/* A single sandboxed run's PID 1, from its set-up to its exec: zygote.py spawns it into a fresh PID namespace
 * before the run's request arrives, and it becomes the program.
 *
 * Why C: a program exec'd by a forked copy of the zygote's interpreter pays for tearing that copy down (about
 * 0.3 ms), and the interpreter's own steps before the exec cost as much again; from this small static process the
 * exec costs what it costs a bare run. Its set-up (the zygote's `_child` does the same in Python, where this
 * program could not be built) is, in order:
 *
 *   own mount namespace (and IPC namespace where the zygote's own could not be locked) with this PID namespace's
 *   /proc; oom_score_adj 1000; an empty capability bounding set; no_new_privs; the run's uid and gid, no
 *   groups; parent-death signal; cwd /scratch; the seccomp filter (argv[3], hex); our mount namespace sent
 *   to the zygote on fd 5 (it lets it go after the run's reply: zygote.release). Then fd 7 is closed: the
 *   zygote's sign that the set-up is done.
 *
 * Fds from the zygote: 0 a stdin memfd (written on the request), 1-2 stdout/stderr, 3-4 the proof pipes (see
 * zygote.py), 5 the request socket, 6 the status pipe, 7 the set-up's "done" pipe.
 *
 * The request, read to EOF from fd 5, possibly carrying a stdin fd (SCM_RIGHTS); little-endian u64 words, then
 * NUL-terminated strings:
 *   stdin (0: /dev/null, 1: fd 0 as it is, 2: the fd passed), nlimits, argc, envc,
 *   nlimits x (resource, value: soft and hard), argc strings, envc strings.
 * Then: stdin on fd 0, the rlimits (after the request is parsed: a tiny RLIMIT_AS must not fail the parse),
 * execve. Any failure is written to fd 6 (close-on-exec: empty once the exec succeeded) and exits 127; an empty
 * request (discarded, or the zygote is gone) exits 0.
 *
 * Usage: init UID NEW_IPC(0|1) SECCOMP_HEX
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

enum { REQUEST = 5, STATUS = 6, READY = 7 };
#define MAX_REQUEST (4 << 20) /* above the kernel's own limit on argv and env (ARG_MAX, 2 MiB by default) */

static char request[MAX_REQUEST];
static size_t length, at;

_Noreturn static void fail(const char *what) {
    char msg[512];
    int n = snprintf(msg, sizeof msg, "%s: %s", what, strerror(errno));
    if (n > 0 && write(STATUS, msg, n < (int)sizeof msg ? (size_t)n : sizeof msg - 1) < 0) {
        /* nothing left to tell it with */
    }
    _exit(127);
}

static uint64_t word(void) {
    uint64_t w;
    if (length - at < sizeof w) {
        errno = EPROTO;
        fail("request cut short");
    }
    memcpy(&w, request + at, sizeof w);
    at += sizeof w;
    return w;
}

static char **strings(uint64_t count) {
    if (count > MAX_REQUEST) {
        errno = EPROTO;
        fail("request out of step");
    }
    char **out = calloc(count + 1, sizeof *out);
    if (!out) fail("request");
    for (uint64_t i = 0; i < count; i++) {
        char *end = memchr(request + at, 0, length - at);
        if (!end) {
            errno = EPROTO;
            fail("request cut short");
        }
        out[i] = request + at;
        at = end - request + 1;
    }
    return out;
}

/* Room for one passed fd in a message's control data, aligned as a cmsghdr. */
union one_fd {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
};

/* A message of `iov` whose control data, one fd at most, goes in `control`. */
static struct msghdr message(struct iovec *iov, union one_fd *control) {
    return (struct msghdr){
        .msg_iov = iov, .msg_iovlen = 1, .msg_control = control->buf, .msg_controllen = sizeof control->buf};
}

static void send_namespace(void) {
    int ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (ns < 0) fail("open /proc/self/ns/mnt");
    union one_fd control = {0};
    char byte = 'n';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = message(&iov, &control);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &ns, sizeof ns);
    if (sendmsg(REQUEST, &msg, MSG_NOSIGNAL) != 1) fail("send the mount namespace");
    close(ns);
}

static void set_up(uid_t uid, int new_ipc, const char *hex) {
    if (unshare(CLONE_NEWNS | (new_ipc ? CLONE_NEWIPC : 0))) fail("unshare");
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)) fail("mount /proc");
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "1000", 4) != 4) fail("oom_score_adj");
    close(fd);
    /* An empty bounding set (where CAP_SETPCAP allows; moot anyway for a non-root uid under no_new_privs). */
    for (int cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)) break;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) fail("no_new_privs");
    if (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) fail("uid");
    /* A uid change clears the parent-death signal, so it is set after: zygote gone -> this whole namespace. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)) fail("pdeathsig");
    if (chdir("/scratch")) fail("chdir /scratch");
    size_t n = strlen(hex) / 2;
    struct sock_filter *filter = malloc(n + 1);
    errno = EINVAL;
    if (!filter || strlen(hex) % 2 || n % sizeof *filter || n / sizeof *filter > BPF_MAXINSNS) fail("seccomp filter");
    for (size_t i = 0; i < n; i++)
        if (sscanf(hex + 2 * i, "%2hhx", (unsigned char *)filter + i) != 1) fail("seccomp filter");
    struct sock_fprog prog = {.len = (unsigned short)(n / sizeof *filter), .filter = filter};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0)) fail("seccomp");
    if (fcntl(REQUEST, F_SETFD, FD_CLOEXEC) || fcntl(STATUS, F_SETFD, FD_CLOEXEC)) fail("fds");
    send_namespace();
    close(READY);
}

/* The request, to EOF; returns the fd that came with it, or -1. */
static int receive(void) {
    union one_fd control;
    struct iovec iov = {.iov_base = request, .iov_len = sizeof request};
    struct msghdr msg = message(&iov, &control);
    ssize_t n = recvmsg(REQUEST, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) _exit(0);
    int passed = -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&passed, CMSG_DATA(c), sizeof passed);
    if (msg.msg_flags & MSG_CTRUNC) {
        errno = EPROTO;
        fail("request: more fds than one");
    }
    length = n;
    while (length < sizeof request && (n = read(REQUEST, request + length, sizeof request - length)) > 0) length += n;
    if (n < 0) fail("read request");
    if (length == sizeof request) {
        errno = E2BIG;
        fail("request");
    }
    close(REQUEST);
    return passed;
}

int main(int argc, char **argv) {
    errno = EINVAL;
    if (argc != 4) fail("usage: init UID NEW_IPC SECCOMP_HEX");
    char *end;
    unsigned long uid = strtoul(argv[1], &end, 10);
    if (!*argv[1] || *end || uid == 0 || uid >= (uid_t)-1) fail("uid: not a non-root uid"); /* never root */
    set_up((uid_t)uid, argv[2][0] == '1', argv[3]);
    int passed = receive();
    uint64_t stdin_kind = word(), nlimits = word(), nargs = word(), nenv = word();
    if (nlimits > MAX_REQUEST) {
        errno = EPROTO;
        fail("request out of step");
    }
    size_t limits = at;
    at += 16 * nlimits; /* the strings first: parsing must not meet the limits (a tiny RLIMIT_AS) */
    if (at > length) {
        errno = EPROTO;
        fail("request cut short");
    }
    char **args = strings(nargs), **env = strings(nenv);
    if (!args[0]) {
        errno = EPROTO;
        fail("request: no program");
    }
    if (stdin_kind == 2 && (passed < 0 || dup2(passed, 0) < 0)) fail("stdin");
    if (stdin_kind == 0) {
        int null = open("/dev/null", O_RDONLY);
        if (null < 0 || dup2(null, 0) < 0) fail("/dev/null");
        close(null);
    }
    if (passed >= 0) close(passed);
    at = limits;
    for (uint64_t i = 0; i < nlimits; i++) {
        uint64_t resource = word(), value = word();
        struct rlimit limit = {.rlim_cur = value, .rlim_max = value};
        if (setrlimit((int)resource, &limit)) fail("setrlimit");
    }
    execve(args[0], args, env);
    char what[256];
    snprintf(what, sizeof what, "execve %s", args[0]);
    fail(what);
}
