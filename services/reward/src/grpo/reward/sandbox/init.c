/* A single sandboxed run's PID 1, from its set-up to its program's exit: zygote.py spawns it into a fresh PID
 * namespace before the run's request arrives, and it starts the program as its child (pid 2).
 *
 * Why C: a program exec'd by a forked copy of the zygote's interpreter pays for tearing that copy down (about
 * 0.3 ms), and the interpreter's own steps before the exec cost as much again; from this small static process the
 * spawn and exec cost what they cost a bare run. Its set-up (the zygote's `_child` does the same in Python, where
 * this program could not be built) is, in order:
 *
 *   own mount namespace (and IPC namespace where the zygote's own could not be locked) with this PID namespace's
 *   /proc; oom_score_adj 1000; an empty capability bounding set; no_new_privs; the run's uid and gid, no
 *   groups; not dumpable; parent-death signal; cwd /scratch; the seccomp filter (argv[3], hex); our mount
 *   namespace sent to the zygote on fd 5 (it lets it go after the run's reply: zygote.release). Then fd 7 is
 *   closed: the zygote's sign that the set-up is done.
 *
 * Why the program is not PID 1 itself: an init drops every signal it has no handler for, even one it sends
 * itself, so `raise(SIGTERM)` or a self-SIGKILL did nothing, and abort() ended in glibc's last resort, a SIGSEGV
 * (exit -11, where a batch's run, batch.py, reported -6). Staying as PID 1 costs a spawn, and keeps what being the
 * init gave: the program shares our uid, but we have every signal at its default, so the kernel drops whatever it
 * sends us; we are not dumpable (no /proc/1/mem or /proc/1/fd), and seccomp refuses ptrace and prlimit64 on
 * another process. When the program exits we exit, and the kernel kills whatever else is left in the namespace
 * (daemons, setsid children, fork-bomb remnants); meanwhile we reap the orphans re-parented to us.
 *
 * Fds from the zygote: 0 a stdin memfd (written on the request), 1-2 stdout/stderr, 3-4 the proof pipes (see
 * zygote.py), 5 the request socket, 6 the status pipe, 7 the set-up's "done" pipe.
 *
 * The request, read to EOF from fd 5, possibly carrying a stdin fd (SCM_RIGHTS); little-endian u64 words, then
 * NUL-terminated strings:
 *   stdin (0: /dev/null, 1: fd 0 as it is, 2: the fd passed), nlimits, argc, envc,
 *   nlimits x (resource, value: soft and hard), argc strings, envc strings.
 * Then the rlimits (after the request is parsed: a tiny RLIMIT_AS must not fail the parse), and the program spawned
 * with its stdin on fd 0. Any failure, its exec's included, is written to fd 6 as text (close-on-exec: the program
 * never holds it) and exits 127; an empty request (discarded, or the zygote is gone) exits 0. Once the program has
 * exited, its wait status goes to fd 6 as a NUL byte and the status in decimal (protocol.exit_record), and we
 * exit 0.
 *
 * Rootless mode (FLAGS bit 2; the zygote is root only in a user namespace of its own, confine.enter_user_namespace):
 * uid 0 of that namespace is the one uid there, so it is the run's; /proc is mounted hidepid=2 and /proc/sys
 * read-only (that uid owns the namespaced sysctls); and after the mounts the init enters a user namespace of its
 * own (RLIMIT_NPROC counts per user namespace: the run's own processes only), then drops every capability
 * (confine.setup_mounts and confine.become do the same in Python).
 *
 * Usage: init UID FLAGS SECCOMP_HEX (FLAGS: 1 a new IPC namespace, 2 rootless)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <linux/capability.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { REQUEST = 5, STATUS = 6, READY = 7 };
enum { NEW_IPC = 1, ROOTLESS = 2 };
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

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    size_t n = strlen(text);
    if (fd < 0 || write(fd, text, n) != (ssize_t)n) fail(path);
    close(fd);
}

/* Rootless mode: the run's own user namespace, 0 mapped to 0 of the zygote's (our uid there). */
static void own_user_namespace(void) {
    if (unshare(CLONE_NEWUSER)) fail("unshare user namespace");
    write_file("/proc/self/setgroups", "deny");
    write_file("/proc/self/uid_map", "0 0 1");
    write_file("/proc/self/gid_map", "0 0 1");
}

static void mount_proc(int rootless) {
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, rootless ? "hidepid=2" : NULL))
        fail("mount /proc");
    if (!rootless) return;
    if (mount("/proc/sys", "/proc/sys", NULL, MS_BIND | MS_REC, NULL)) fail("bind /proc/sys");
    if (mount(NULL, "/proc/sys", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
        fail("read-only /proc/sys");
}

static void set_up(uid_t uid, unsigned long flags, const char *hex) {
    int rootless = (flags & ROOTLESS) != 0;
    if (unshare(CLONE_NEWNS | (flags & NEW_IPC ? CLONE_NEWIPC : 0))) fail("unshare");
    mount_proc(rootless);
    write_file("/proc/self/oom_score_adj", "1000");
    if (rootless) own_user_namespace(); /* before the bounding set: a new user namespace fills it again */
    /* An empty bounding set (where CAP_SETPCAP allows; moot anyway for a non-root uid under no_new_privs). */
    for (int cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)) break;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) fail("no_new_privs");
    /* setgroups is denied in a user namespace made without privileges (and we have no groups there to drop). */
    if ((!rootless && setgroups(0, NULL)) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) fail("uid");
    if (rootless) { /* uid 0 of our user namespace keeps its capabilities through setresuid: drop them */
        struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
        struct __user_cap_data_struct none[2] = {{0}};
        if (syscall(SYS_capset, &header, none)) fail("capset");
    }
    /* The program shares our uid: neither /proc/1/mem nor /proc/1/fd may be its way into us. (The uid change
     * already cleared it where fs.suid_dumpable is 0; not every host's is.) */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) fail("not dumpable");
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

/* The program, spawned (a vfork and an exec, as a batch's supervisor starts its runs: no copy of our memory is
 * made) with its stdin on fd 0; the rlimits are set on us first, and inherited. (They cannot hurt us: from here we
 * only wait, and write a few bytes to a pipe.) Its pid; a failure, its exec's too, is reported and exits 127. */
static pid_t spawn_program(char **args, char **env, uint64_t stdin_kind, int passed, uint64_t nlimits) {
    for (uint64_t i = 0; i < nlimits; i++) {
        uint64_t resource = word(), value = word();
        struct rlimit limit = {.rlim_cur = value, .rlim_max = value};
        if (setrlimit((int)resource, &limit)) fail("setrlimit");
    }
    if (stdin_kind == 2 && passed < 0) {
        errno = EPROTO;
        fail("stdin: the request came without its fd");
    }
    posix_spawn_file_actions_t actions;
    int err = posix_spawn_file_actions_init(&actions);
    if (!err && stdin_kind == 2) err = posix_spawn_file_actions_adddup2(&actions, passed, 0);
    if (!err && stdin_kind == 0) err = posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    pid_t program = -1;
    if (!err) err = posix_spawn(&program, args[0], &actions, NULL, args, env);
    if (err) {
        errno = err;
        char what[256];
        snprintf(what, sizeof what, "execve %s", args[0]);
        fail(what);
    }
    posix_spawn_file_actions_destroy(&actions);
    return program;
}

/* Reap until the program itself has exited (orphans re-parented to us go on the way: a zombie counts against the
 * run's RLIMIT_NPROC until it is reaped); its wait status. */
static int wait_for(pid_t program) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, __WALL);
        if (pid == program) return status;
        if (pid < 0 && errno != EINTR) fail("wait for the program");
    }
}

int main(int argc, char **argv) {
    errno = EINVAL;
    if (argc != 4) fail("usage: init UID FLAGS SECCOMP_HEX");
    char *end;
    unsigned long flags = strtoul(argv[2], &end, 10);
    if (!*argv[2] || *end || flags > (NEW_IPC | ROOTLESS)) fail("flags");
    unsigned long uid = strtoul(argv[1], &end, 10);
    /* Never root: in rootless mode 0 is the one uid of the zygote's user namespace, and holds no capability. */
    if (!*argv[1] || *end || (uid == 0 && !(flags & ROOTLESS)) || uid >= (uid_t)-1) fail("uid: not a non-root uid");
    signal(SIGCHLD, SIG_DFL); /* not ignored, whatever we were started with: wait_for must see the exit */
    /* A session of our own: a process group reaches past PID namespaces (kill(0), setpriority(PRIO_PGRP)), and
     * the zygote's is the service's too. In rootless mode they share the run's uid, so those would act on them. */
    if (setsid() < 0) fail("setsid");
    set_up((uid_t)uid, flags, argv[3]);
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
    at = limits;
    pid_t program = spawn_program(args, env, stdin_kind, passed, nlimits);
    for (int fd = 0; fd < 5; fd++) close(fd); /* the program's fds are its own: its outputs end with it */
    if (passed >= 0) close(passed);
    int status = wait_for(program);
    char record[32];
    int n = snprintf(record, sizeof record, "%c%d", 0, status);
    if (write(STATUS, record, (size_t)n) != n) _exit(127); /* the zygote reads none: a sandbox error */
    _exit(0);
}
