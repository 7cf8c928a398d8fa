#!/bin/sh
# A headless Wayland desktop for drag tests: sway 1.7 on an 800x300 output, run until this
# script gets SIGTERM or SIGINT. Prints, once the compositor is up:
#     WAYLAND_DISPLAY=<absolute socket path>
#     SWAYSOCK=<IPC socket path>
# Windows float and are placed by title, as the apps here are at X11: gtk3-, swift- and
# qt-source at 20,50; gtk3-, swift-, c-, qt- and cpp-target at 300,50; plain-target at 580,50.
set -eu

# sway refuses to run as root ("Unable to drop root"), so it runs as nobody, in a runtime
# directory of its own that nobody owns. Root's clients reach its socket all the same.
runtime=$(mktemp -d /tmp/dragbroker-sway.XXXXXX)
chown nobody:nogroup "$runtime"
chmod 700 "$runtime"
cat > "$runtime/config" <<'EOF'
xwayland disable
output HEADLESS-1 resolution 800x300 position 0 0
default_border none
default_floating_border none
focus_follows_mouse no
for_window [title=".*"] floating enable
for_window [title="^(gtk3|swift|qt)-source$"] move absolute position 20 50
for_window [title="^(gtk3|swift|c|qt|cpp)-target$"] move absolute position 300 50
for_window [title="^plain-target$"] move absolute position 580 50
EOF
chmod 644 "$runtime/config"

# The headless seat has no input devices; pointer input comes from virtual-pointer.
setpriv --reuid=nobody --regid=nogroup --clear-groups -- env -i PATH=/usr/bin:/bin HOME="$runtime" \
    XDG_RUNTIME_DIR="$runtime" WLR_BACKENDS=headless WLR_LIBINPUT_NO_DEVICES=1 WLR_RENDERER=pixman \
    sway -c "$runtime/config" >"$runtime/sway.log" 2>&1 &
sway=$!

stop() {
    kill "$sway" 2>/dev/null || true
    wait "$sway" 2>/dev/null || true
    rm -rf "$runtime"
}
trap 'stop; exit 0' TERM INT
trap stop EXIT

tries=0
while :; do
    display=$(ls "$runtime" | grep -E '^wayland-[0-9]+$' | head -n 1 || true)
    ipc=$(ls "$runtime" | grep -E '^sway-ipc\..*\.sock$' | head -n 1 || true)
    if [ -n "$display" ] && [ -n "$ipc" ] && SWAYSOCK="$runtime/$ipc" swaymsg -t get_outputs >/dev/null 2>&1; then
        break
    fi
    if ! kill -0 "$sway" 2>/dev/null || [ $tries -ge 200 ]; then
        echo "sway did not start:" >&2
        cat "$runtime/sway.log" >&2
        exit 1
    fi
    tries=$((tries + 1))
    sleep 0.05
done
echo "WAYLAND_DISPLAY=$runtime/$display"
echo "SWAYSOCK=$runtime/$ipc"
wait "$sway"
