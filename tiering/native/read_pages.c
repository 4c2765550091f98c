/* Reading a run of NAS page files into their final memory, and checksumming each, in one
 * call that holds no Python lock (see tiering/native/__init__.py for why).
 *
 * For page i: open paths[i], fill its parts in order (the first is the block's header),
 * going on after short reads, and close it. got[i] is the bytes read, or -errno when the
 * open or a read failed. When every part was filled, digests[i] is the xxh3-64 of the
 * header's first `covered` bytes followed by the other parts, computed with the caller's
 * xxhash functions (those of the Python package that wrote the checksum), right after the
 * read while the page is still in the CPU cache; otherwise it is 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

typedef void *(*xxh_create_fn)(void);
typedef int (*xxh_free_fn)(void *);
typedef int (*xxh_reset_fn)(void *);
typedef int (*xxh_update_fn)(void *, const void *, size_t);
typedef uint64_t (*xxh_digest_fn)(const void *);

/* most parts one page may have (a header and the payload's views) */
#define KVGATE_MAX_PARTS 64

/* Fill parts[0..count) from fd in order; the bytes read (fewer at an early end), or -errno. */
static int64_t read_parts(int fd, struct iovec *parts, int count) {
    int64_t got = 0;
    int first = 0;
    while (first < count) {
        ssize_t n = readv(fd, parts + first, count - first);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) break;
        got += n;
        while (first < count && (size_t)n >= parts[first].iov_len) {
            n -= (ssize_t)parts[first].iov_len;
            first++;
        }
        if (first < count) {
            parts[first].iov_base = (char *)parts[first].iov_base + n;
            parts[first].iov_len -= (size_t)n;
        }
    }
    return got;
}

int64_t kvgate_max_parts(void) { return KVGATE_MAX_PARTS; }

/* xxh: XXH3_createState, XXH3_freeState, XXH3_64bits_reset, XXH3_64bits_update,
 * XXH3_64bits_digest. part_counts[i] parts of page i follow page i-1's in part_ptrs and
 * part_lens. Returns 0, or -ENOMEM when no hash state could be made, -EINVAL when a page
 * has more than KVGATE_MAX_PARTS parts or its first part is shorter than `covered`. */
int64_t kvgate_read_pages(int64_t n, const char *const *paths, const int64_t *part_counts,
                          void *const *part_ptrs, const int64_t *part_lens, int64_t covered,
                          void *const *xxh, int64_t *got, uint64_t *digests) {
    for (int64_t i = 0, at = 0; i < n; at += part_counts[i], i++)
        if (part_counts[i] < 1 || part_counts[i] > KVGATE_MAX_PARTS || part_lens[at] < covered)
            return -EINVAL;
    xxh_update_fn update = (xxh_update_fn)xxh[3];
    void *state = ((xxh_create_fn)xxh[0])();
    if (!state) return -ENOMEM;
    for (int64_t i = 0, at = 0; i < n; at += part_counts[i], i++) {
        int count = (int)part_counts[i];
        struct iovec parts[KVGATE_MAX_PARTS];
        int64_t size = 0;
        for (int p = 0; p < count; p++) {
            parts[p].iov_base = part_ptrs[at + p];
            parts[p].iov_len = (size_t)part_lens[at + p];
            size += part_lens[at + p];
        }
        digests[i] = 0;
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            got[i] = -errno;
            continue;
        }
        got[i] = read_parts(fd, parts, count);
        close(fd);
        if (got[i] != size) continue;
        ((xxh_reset_fn)xxh[2])(state);
        update(state, part_ptrs[at], (size_t)covered);
        for (int p = 1; p < count; p++) update(state, part_ptrs[at + p], (size_t)part_lens[at + p]);
        digests[i] = ((xxh_digest_fn)xxh[4])(state);
    }
    ((xxh_free_fn)xxh[1])(state);
    return 0;
}
