// The sandbox's entry point for Java runs (grpo/reward/sandbox/languages.py): Main.main on a thread with a 64 MiB
// stack, as C, C++ and Rust get, for deep recursion. Not -Xss64m: it sizes every Java thread's stack, the JVM's
// own included, and under RLIMIT_DATA their reserved stacks kept the JVM from starting. A plain class, no lambda:
// a lambda's bootstrap costs the start-up tens of milliseconds.
public final class GrpoSandboxMain implements Runnable {
    private final String[] args;
    private Throwable failure;

    private GrpoSandboxMain(String[] args) {
        this.args = args;
    }

    @Override
    public void run() {
        try {
            Class.forName("Main").getMethod("main", String[].class).invoke(null, (Object) args);
        } catch (java.lang.reflect.InvocationTargetException e) {
            failure = e.getCause();
        } catch (Throwable e) {
            failure = e;
        }
    }

    public static void main(String[] args) throws Throwable {
        GrpoSandboxMain program = new GrpoSandboxMain(args);
        Thread thread = new Thread(null, program, "main", 64L << 20);
        thread.start();
        thread.join();
        if (program.failure != null) {
            throw program.failure; // the JVM reports it as for Main: "Exception in thread "main" ...", exit code 1
        }
    }
}
