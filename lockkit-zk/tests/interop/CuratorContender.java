// A Curator 5 service for tests/interop_curator.rs: it takes an InterProcessMutex on the znode
// path lockkit uses for a key and runs critical sections of the shared protocol of
// lockkit-core/src/testing/sections.rs in a directory (marker, counter, history, overlaps).
//
// Usage: java -cp curator-recipes.jar:. CuratorContender CONNECT PATH SECTIONS HOLD_MS DIR TAG [NAMESPACE]
// (NAMESPACE: Curator's namespace, prefixed to PATH by Curator.)
// Prints "ready" once connected, starts at a line on stdin, prints "done" and exits 0 when all
// sections ran; exits 2 on a lock not granted within 60 s, 1 on any other error.
//
// Or, for the read-write lock tests: CuratorContender rwlock CONNECT PATH MODE MS, with an
// InterProcessReadWriteLock on PATH. MODE write: takes the write lock, prints "held TOKEN",
// holds it MS, releases it. MODE read: tries the read lock for MS and prints "refused" (or
// "granted TOKEN", released at once), then waits up to 60 s for it and prints "granted TOKEN"
// before releasing it. "ready", the start on stdin and "done" as above. TOKEN: the czxid of
// Curator's node.

import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryNTimes;

public final class CuratorContender {
    /** Exposes the path of the node this thread holds, to read its czxid (the fencing token). */
    static final class Mutex extends InterProcessMutex {
        Mutex(CuratorFramework client, String path) {
            super(client, path);
        }

        String heldNode() {
            return getLockPath();
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length > 0 && args[0].equals("rwlock")) {
            readWrite(args);
            return;
        }
        if (args.length != 6 && args.length != 7) {
            System.err.println("usage: CuratorContender CONNECT PATH SECTIONS HOLD_MS DIR TAG [NAMESPACE]");
            System.exit(1);
        }
        String connect = args[0];
        String path = args[1];
        int sections = Integer.parseInt(args[2]);
        long holdMs = Long.parseLong(args[3]);
        Path dir = Path.of(args[4]);
        String tag = args[5];
        CuratorFrameworkFactory.Builder builder = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(5_000)
                .retryPolicy(new RetryNTimes(3, 100));
        if (args.length == 7) {
            builder = builder.namespace(args[6]);
        }

        try (CuratorFramework client = builder.build()) {
            client.start();
            if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
                throw new IllegalStateException("no ZooKeeper session within 20 s");
            }
            Mutex mutex = new Mutex(client, path);
            System.out.println("ready");
            System.out.flush();
            if (System.in.read() < 0) {
                throw new IllegalStateException("stdin closed before the start");
            }
            for (int i = 0; i < sections; i++) {
                if (!mutex.acquire(60, TimeUnit.SECONDS)) {
                    System.err.println("the lock was not granted within 60 s");
                    System.exit(2);
                }
                try {
                    long token = client.checkExists().forPath(mutex.heldNode()).getCzxid();
                    section(dir, tag, token, holdMs);
                } finally {
                    mutex.release();
                }
            }
        }
        System.out.println("done");
    }

    /** The read-write lock mode (see the top of the file). */
    static void readWrite(String[] args) throws Exception {
        if (args.length != 5 || !(args[3].equals("read") || args[3].equals("write"))) {
            System.err.println("usage: CuratorContender rwlock CONNECT PATH read|write MS");
            System.exit(1);
        }
        String path = args[2];
        long ms = Long.parseLong(args[4]);
        CuratorFrameworkFactory.Builder builder = CuratorFrameworkFactory.builder()
                .connectString(args[1])
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(5_000)
                .retryPolicy(new RetryNTimes(3, 100));
        try (CuratorFramework client = builder.build()) {
            client.start();
            if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
                throw new IllegalStateException("no ZooKeeper session within 20 s");
            }
            InterProcessReadWriteLock lock = new InterProcessReadWriteLock(client, path);
            System.out.println("ready");
            System.out.flush();
            if (System.in.read() < 0) {
                throw new IllegalStateException("stdin closed before the start");
            }
            if (args[3].equals("write")) {
                InterProcessMutex write = lock.writeLock();
                if (!write.acquire(60, TimeUnit.SECONDS)) {
                    System.exit(2);
                }
                try {
                    say("held " + token(client, path, "__WRIT__"));
                    Thread.sleep(ms);
                } finally {
                    write.release();
                }
            } else {
                InterProcessMutex read = lock.readLock();
                if (read.acquire(ms, TimeUnit.MILLISECONDS)) {
                    say("granted " + token(client, path, "__READ__"));
                    read.release();
                } else {
                    say("refused");
                }
                if (!read.acquire(60, TimeUnit.SECONDS)) {
                    System.exit(2);
                }
                try {
                    say("granted " + token(client, path, "__READ__"));
                } finally {
                    read.release();
                }
            }
        }
        System.out.println("done");
    }

    /** The czxid of the (only) node of Curator's under PATH whose name has KIND in it. */
    static long token(CuratorFramework client, String path, String kind) throws Exception {
        for (String child : client.getChildren().forPath(path)) {
            if (child.contains(kind)) {
                return client.checkExists().forPath(path + "/" + child).getCzxid();
            }
        }
        throw new IllegalStateException("no " + kind + " node under " + path);
    }

    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    /** One critical section: the same steps, in the same order, as Sections::run in Rust. */
    static void section(Path dir, String tag, long token, long holdMs) throws Exception {
        Path marker = dir.resolve("marker");
        try {
            Files.createFile(marker);
        } catch (FileAlreadyExistsException e) {
            append(dir.resolve("overlaps"), tag + "\n");
        }
        Path counter = dir.resolve("counter");
        long seen;
        try {
            seen = Long.parseLong(Files.readString(counter, StandardCharsets.UTF_8).trim());
        } catch (NumberFormatException e) { // torn by a write of an overlapping section
            append(dir.resolve("overlaps"), tag + "\n");
            seen = 0;
        }
        Thread.sleep(holdMs);
        Files.writeString(counter, (seen + 1) + "\n", StandardCharsets.UTF_8);
        append(dir.resolve("history"), tag + " " + token + "\n");
        try {
            Files.delete(marker);
        } catch (NoSuchFileException e) {
            append(dir.resolve("overlaps"), tag + "\n");
        }
    }

    static void append(Path file, String line) throws Exception {
        Files.writeString(file, line, StandardCharsets.UTF_8,
                StandardOpenOption.CREATE, StandardOpenOption.APPEND);
    }
}
