#!/bin/sh
# Name the processes holding fcntl locks on the given files: one "pid <pid> (<command line>) holds <file>" line
# per holder, nothing when no one holds them. Reads /proc/locks (fields: id, class, mode, access, pid,
# major:minor:inode, start, end; proc(5)), so it needs no lsof or fuser on the node.
for f in "$@"; do
  [ -e "$f" ] || continue
  inode=$(stat -c %i "$f") || continue
  awk -v ino="$inode" '{ n = split($6, a, ":"); if (a[n] == ino) print $5 }' /proc/locks | sort -u |
    while read -r pid; do
      cmd=$(tr '\0\n' '  ' <"/proc/$pid/cmdline" 2>/dev/null | sed 's/ *$//')
      echo "pid $pid (${cmd:-command line unreadable}) holds $f"
    done
done
exit 0
