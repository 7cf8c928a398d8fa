#!/usr/bin/python3
"""Runs a command in a pseudo-terminal, as a person would see it, and prints everything it
wrote until `marker` appears or `seconds` pass; then interrupts it (Ctrl-C)."""
import fcntl, os, pty, select, signal, struct, sys, termios, time

seconds, marker, command = float(sys.argv[1]), sys.argv[2].encode(), sys.argv[3:]
pid, fd = pty.fork()
if pid == 0:
    os.execv(command[0], command)
# A screen of $ROWS rows (default 24) by 120 columns, as a terminal would report.
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", int(os.environ.get("ROWS", "24")), 120, 0, 0))
captured = b""
deadline = time.time() + seconds
while time.time() < deadline and marker not in captured:
    ready, _, _ = select.select([fd], [], [], 0.1)
    if ready:
        try:
            captured += os.read(fd, 65536)
        except OSError:
            break
os.kill(pid, signal.SIGINT)
os.waitpid(pid, 0)
sys.stdout.write(captured.decode(errors="replace"))
