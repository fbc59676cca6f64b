// The desktop API's entry in the VM (docs/desktop.md): answers a screenshot itself and hands anything else to the resident helper.
//
// The API runs it through the exec path with one JSON line on stdin. Compiled static (gcc -static -O2) on the host when
// the desktop base is committed (images/build/base.ts), so a call starts no interpreter: under TCG starting bash took
// 116–228 ms and the Python helper's screenshot ~270 ms (BGRX to RGB, zlib); this takes a few tens of ms.
//
//   {"cmd":"screenshot","scale"?}  the root window by MIT-SHM (GetImage over the socket when it is not there),
//                                   nearest pixel for scale < 1, as a PNG (8-bit RGB, filter 0 rows) on stdout
//   anything else                   to the resident helper on 127.0.0.1:AGENTVM_DESKTOP_HELPER_PORT (default 5999),
//                                   its answer on stdout; for actions with a screenshot it asks the helper to leave
//                                   the screenshot to it (`shot <scale>` after the stillness wait) and adds it itself.
//                                   No helper answering: `helper request` runs the request itself.
//
// Exit 2: refused (the reason on stderr as `refused: …`); 1: failed.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define HELPER "/usr/lib/agentvm/desktop/helper"

static void fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(code == 2 ? "refused: " : "error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(code);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p) fail(1, "out of memory (%zu bytes)", n);
  return p;
}

static void write_all(int fd, const void *buf, size_t n) {
  const uint8_t *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(1, "write: %s", strerror(errno));
    p += w;
    n -= (size_t)w;
  }
}

/* ---- the request: one JSON object on a line; only its top-level members are looked at ---- */

/** The end of the JSON value starting at p (a string, a number, a literal, or a nested object/array), or NULL. */
static const char *skip_value(const char *p) {
  int depth = 0;
  do {
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    if (*p == '"') {
      for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && p[1]) p++;
      if (!*p) return NULL;
      p++;
    } else if (*p == '{' || *p == '[') {
      depth++;
      p++;
    } else if (*p == '}' || *p == ']') {
      if (depth == 0) return p;
      depth--;
      p++;
    } else if (*p == ',' || *p == ':') {
      if (depth == 0) return p;
      p++;
    } else if (*p) {
      while (*p && !strchr(",:]} \t\r\n", *p)) p++;
    } else {
      return NULL;
    }
  } while (depth > 0);
  return p;
}

/** The value of top-level member `key` of the object in `json` (a pointer to its first character), or NULL. */
static const char *member(const char *json, const char *key) {
  const char *p = json;
  while (*p == ' ' || *p == '\t') p++;
  if (*p++ != '{') return NULL;
  size_t klen = strlen(key);
  for (;;) {
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    if (*p != '"') return NULL;
    const char *name = p + 1;
    const char *end = skip_value(p);
    if (!end) return NULL;
    int match = (size_t)(end - 1 - name) == klen && memcmp(name, key, klen) == 0;
    p = end;
    while (*p == ' ' || *p == '\t') p++;
    if (*p++ != ':') return NULL;
    while (*p == ' ' || *p == '\t') p++;
    if (match) return p;
    p = skip_value(p);
    if (!p) return NULL;
  }
}

/* ---- X11: the few requests a screenshot needs, over the display's unix socket (Xvfb runs with -ac: no auth) ---- */

struct display {
  int fd;
  uint32_t root, id_base;
  uint16_t width, height;
  uint16_t seq;
};

static void x_read(struct display *d, void *buf, size_t n) {
  uint8_t *p = buf;
  while (n > 0) {
    ssize_t r = read(d->fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail(1, "the X server closed the connection");
    p += r;
    n -= (size_t)r;
  }
}

static void x_skip(struct display *d, size_t n) {
  uint8_t buf[4096];
  while (n > 0) {
    size_t k = n < sizeof buf ? n : sizeof buf;
    x_read(d, buf, k);
    n -= k;
  }
}

static uint16_t x_send(struct display *d, const void *req, size_t n) {
  write_all(d->fd, req, n);
  return ++d->seq;
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24); }

/**
 * The 32-byte head of the reply to `seq` (events skipped; its extra bytes left unread); 0 when the server answered
 * an error instead (its code in *error when asked for, else it fails).
 */
static int x_reply(struct display *d, uint16_t seq, uint8_t head[32], int *error) {
  for (;;) {
    x_read(d, head, 32);
    if (head[0] == 0) {
      if (get16(head + 2) != seq) continue;
      if (error) {
        *error = head[1];
        return 0;
      }
      fail(1, "X error %d on request %d", head[1], seq);
    }
    if (head[0] != 1) continue;  // an event
    if (get16(head + 2) == seq) return 1;
    x_skip(d, (size_t)get32(head + 4) * 4);
  }
}

/** Connects to DISPLAY: `:N` is /tmp/.X11-unix/XN; a name starting with `/` is the socket's path before its last `:` (as xcb reads it). */
static void x_open(struct display *d) {
  const char *name = getenv("DISPLAY");
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (name && name[0] == '/') {
    const char *colon = strrchr(name, ':');
    size_t n = colon ? (size_t)(colon - name) : strlen(name);
    if (n >= sizeof addr.sun_path) fail(1, "DISPLAY's socket path is too long");
    memcpy(addr.sun_path, name, n);
  } else {
    const char *colon = name ? strchr(name, ':') : NULL;
    snprintf(addr.sun_path, sizeof addr.sun_path, "/tmp/.X11-unix/X%d", colon ? atoi(colon + 1) : 0);
  }
  d->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (d->fd < 0 || connect(d->fd, (struct sockaddr *)&addr, sizeof addr) != 0) fail(1, "cannot connect to the X display %s: %s", addr.sun_path, strerror(errno));
  uint8_t setup[12] = {'l', 0, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  write_all(d->fd, setup, sizeof setup);
  uint8_t head[8];
  x_read(d, head, 8);
  size_t len = (size_t)get16(head + 6) * 4;
  uint8_t *extra = xmalloc(len);
  x_read(d, extra, len);
  if (head[0] != 1) fail(1, "the X server refused the connection: %.*s", head[1] < len ? head[1] : (int)len, (char *)extra);
  d->id_base = get32(extra + 4);
  uint16_t vendor_len = get16(extra + 16);
  uint8_t nformats = extra[21];
  size_t at = 32 + ((size_t)vendor_len + 3) / 4 * 4;
  int bpp24 = 0;
  for (int i = 0; i < nformats; i++, at += 8)
    if (extra[at] == 24) bpp24 = extra[at + 1];
  if (at + 40 > len) fail(1, "the X server's setup is short");
  d->root = get32(extra + at);
  uint32_t visual = get32(extra + at + 32);
  d->width = get16(extra + at + 20);
  d->height = get16(extra + at + 22);
  uint8_t depth = extra[at + 38];
  uint8_t ndepths = extra[at + 39];
  // The root visual's masks: the conversion below reads pixels as 0x00RRGGBB words.
  uint32_t masks[3] = {0, 0, 0};
  at += 40;
  for (int i = 0; i < ndepths && at + 8 <= len; i++) {
    uint16_t nvisuals = get16(extra + at + 2);
    at += 8;
    for (int v = 0; v < nvisuals && at + 24 <= len; v++, at += 24)
      if (get32(extra + at) == visual) masks[0] = get32(extra + at + 8), masks[1] = get32(extra + at + 12), masks[2] = get32(extra + at + 16);
  }
  if (depth != 24 || bpp24 != 32 || masks[0] != 0xFF0000 || masks[1] != 0xFF00 || masks[2] != 0xFF)
    fail(1, "unsupported display format (depth %d, %d bits a pixel, masks %x %x %x)", depth, bpp24, masks[0], masks[1], masks[2]);
  free(extra);
}

/** The major opcode of an extension, or 0 when the server has none of that name. */
static int x_extension(struct display *d, const char *name) {
  uint8_t req[8 + 32] = {98, 0};
  size_t n = strlen(name);
  size_t words = 2 + (n + 3) / 4;
  put16(req + 2, (uint16_t)words);
  put16(req + 4, (uint16_t)n);
  memcpy(req + 8, name, n);
  uint8_t head[32];
  x_reply(d, x_send(d, req, words * 4), head, NULL);
  return head[8] ? head[9] : 0;
}

/**
 * The root window as 0x??RRGGBB words, width*height of them. MIT-SHM when the server has it (one copy into shared
 * memory, not 3 MB through the socket), else GetImage.
 */
static uint32_t *x_image(struct display *d) {
  size_t bytes = (size_t)d->width * d->height * 4;
  int shm = x_extension(d, "MIT-SHM");
  if (shm) {
    int id = shmget(IPC_PRIVATE, bytes, IPC_CREAT | 0600);
    void *mem = id >= 0 ? shmat(id, NULL, 0) : (void *)-1;
    // Marked for removal at once: it goes when the last process detaches it (this one at its exit, the server when
    // we disconnect), so a call killed halfway leaves nothing behind. Linux lets the server attach it meanwhile.
    if (id >= 0) shmctl(id, IPC_RMID, NULL);
    if (mem != (void *)-1) {
      uint32_t seg = d->id_base | 1;
      uint8_t attach[16] = {(uint8_t)shm, 1};
      put16(attach + 2, 4);
      put32(attach + 4, seg);
      put32(attach + 8, (uint32_t)id);
      attach[12] = 0;  // read-write: the server writes the image
      x_send(d, attach, sizeof attach);
      uint8_t get[32] = {(uint8_t)shm, 4};
      put16(get + 2, 8);
      put32(get + 4, d->root);
      put16(get + 12, d->width);
      put16(get + 14, d->height);
      put32(get + 16, 0xFFFFFFFF);
      get[20] = 2;  // ZPixmap
      put32(get + 24, seg);
      put32(get + 28, 0);
      uint8_t head[32];
      int error = 0;
      if (x_reply(d, x_send(d, get, sizeof get), head, &error) && get32(head + 12) >= bytes) return mem;
      shmdt(mem);
      // An error (a server that cannot attach our segment): the socket below.
    }
  }
  uint8_t req[20] = {73, 2};
  put16(req + 2, 5);
  put32(req + 4, d->root);
  put16(req + 12, d->width);
  put16(req + 14, d->height);
  put32(req + 16, 0xFFFFFFFF);
  uint8_t head[32];
  x_reply(d, x_send(d, req, sizeof req), head, NULL);
  size_t len = (size_t)get32(head + 4) * 4;
  if (len < bytes) fail(1, "unsupported display format (%zu bytes for %dx%d)", len, d->width, d->height);
  uint32_t *pixels = xmalloc(len);
  x_read(d, pixels, len);
  return pixels;
}

/* ---- PNG: 8-bit RGB, filter 0 rows, one fixed-Huffman deflate block of runs ---- */
//
// A screen is flat colour and repeated rows: each pixel that equals the one to its left is part of a match at
// distance 3, one that equals the pixel above part of a match at distance one row; the rest are literals. Fixed codes
// (no tables to build or send) and whole-pixel comparisons of 32-bit words: one pass, a few operations a pixel.

struct bits {
  uint8_t *out;
  size_t at;
  uint64_t acc;
  int n;
};

static inline void put_bits(struct bits *b, uint32_t value, int count) {
  b->acc |= (uint64_t)value << b->n;
  b->n += count;
  if (b->n >= 32) {
    put32(b->out + b->at, (uint32_t)b->acc);
    b->at += 4;
    b->acc >>= 32;
    b->n -= 32;
  }
}

static void flush_bits(struct bits *b) {
  while (b->n > 0) {
    b->out[b->at++] = (uint8_t)b->acc;
    b->acc >>= 8;
    b->n -= 8;
  }
  b->n = 0;
  b->acc = 0;
}

static uint32_t reverse(uint32_t code, int len) {
  uint32_t r = 0;
  for (int i = 0; i < len; i++) r |= ((code >> i) & 1) << (len - 1 - i);
  return r;
}

/** Fixed Huffman codes, bit-reversed for the LSB-first writer: literals, and each match length with its extra bits. */
static uint32_t lit_code[256];
static uint8_t lit_len[256];
static uint32_t match_code[259];
static uint8_t match_len[259];

static void fixed_code(int sym, uint32_t *code, int *len) {
  if (sym < 144) *code = 0x30 + (uint32_t)sym, *len = 8;
  else if (sym < 256) *code = 0x190 + (uint32_t)(sym - 144), *len = 9;
  else if (sym < 280) *code = (uint32_t)(sym - 256), *len = 7;
  else *code = 0xC0 + (uint32_t)(sym - 280), *len = 8;
  *code = reverse(*code, *len);
}

static const uint16_t len_base[29] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t dist_base[30] = {1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

static void init_codes(void) {
  for (int s = 0; s < 256; s++) {
    int len;
    fixed_code(s, &lit_code[s], &len);
    lit_len[s] = (uint8_t)len;
  }
  for (int length = 3; length <= 258; length++) {
    int i = 28;
    while (len_base[i] > length) i--;
    uint32_t code;
    int len;
    fixed_code(257 + i, &code, &len);
    match_code[length] = code | (uint32_t)(length - len_base[i]) << len;
    match_len[length] = (uint8_t)(len + len_extra[i]);
  }
}

/** A distance's code with its extra bits (5-bit fixed codes). */
static void dist_code(uint32_t distance, uint32_t *code, int *len) {
  int i = 29;
  while (dist_base[i] > distance) i--;
  *code = reverse((uint32_t)i, 5) | (distance - dist_base[i]) << 5;
  *len = 5 + dist_extra[i];
}

/** A run of `pixels` pixels copied from `dist` bytes back: matches of at most 258 bytes (86 pixels), each a multiple of 3. */
static inline void put_run(struct bits *b, size_t pixels, uint32_t dcode, int dlen) {
  while (pixels > 0) {
    size_t n = pixels > 86 ? 86 : pixels;
    put_bits(b, match_code[n * 3], match_len[n * 3]);
    put_bits(b, dcode, dlen);
    pixels -= n;
  }
}

static inline void put_pixel(struct bits *b, uint32_t p) {
  uint8_t r = (uint8_t)(p >> 16), g = (uint8_t)(p >> 8), bl = (uint8_t)p;
  put_bits(b, lit_code[r] | lit_code[g] << lit_len[r], lit_len[r] + lit_len[g]);
  put_bits(b, lit_code[bl], lit_len[bl]);
}

static uint32_t crc_table[256];

static void init_crc(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    crc_table[n] = c;
  }
}

static uint32_t crc32(uint32_t crc, const uint8_t *p, size_t n) {
  crc = ~crc;
  while (n--) crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

static void put32be(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v; }

/** Ends the chunk whose length field is at `start` (its type follows it) and that runs to `end`: its length and CRC. */
static size_t end_chunk(uint8_t *png, size_t start, size_t end) {
  put32be(png + start, (uint32_t)(end - start - 8));
  put32be(png + end, crc32(0, png + start + 4, end - start - 4));
  return end + 4;
}

/** A PNG of w x h pixels (0x??RRGGBB words, `stride` words a row); its size in *size. */
static uint8_t *png_encode(const uint32_t *px, int w, int h, size_t stride, size_t *size) {
  init_codes();
  init_crc();
  size_t row_bytes = (size_t)w * 3 + 1;
  size_t cap = row_bytes * h / 8 * 9 + (size_t)h * 8 + 1024;  // every byte a 9-bit literal, at worst
  uint8_t *png = xmalloc(cap);
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  memcpy(png, sig, 8);
  size_t at = 8;
  memcpy(png + at + 4, "IHDR", 4);
  put32be(png + at + 8, (uint32_t)w);
  put32be(png + at + 12, (uint32_t)h);
  memcpy(png + at + 16, "\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, filter method 0, no interlace
  at = end_chunk(png, at, at + 21);
  size_t idat = at;
  memcpy(png + idat + 4, "IDAT", 4);
  png[idat + 8] = 0x78, png[idat + 9] = 0x01;  // zlib: deflate, 32 KB window, no dictionary
  struct bits b = {.out = png + idat + 10};
  put_bits(&b, 3, 3);  // the final block, fixed codes
  uint32_t left_code, up_code;
  int left_len, up_len;
  dist_code(3, &left_code, &left_len);
  dist_code((uint32_t)row_bytes, &up_code, &up_len);
  uint64_t a = 1, s = 0;  // Adler-32 of the filtered rows
  for (int y = 0; y < h; y++) {
    const uint32_t *row = px + (size_t)y * stride;
    const uint32_t *up = y > 0 ? row - stride : NULL;
    put_bits(&b, lit_code[0], lit_len[0]);  // the row's filter: none
    // Adler-32 a pixel at a time: its three bytes r, g, b add 3a + 3r + 2g + b to the second sum.
    s += a;
    for (int x = 0; x < w; x++) {
      uint32_t p = row[x];
      uint32_t r = (p >> 16) & 0xFF, g = (p >> 8) & 0xFF, bl = p & 0xFF;
      s += 3 * a + 3 * r + 2 * g + bl;
      a += r + g + bl;
    }
    a %= 65521;
    s %= 65521;
    int x = 0;
    while (x < w) {
      uint32_t p = row[x] & 0xFFFFFF;
      size_t left = 0, above = 0;
      if (x > 0 && ((row[x - 1] ^ p) & 0xFFFFFF) == 0)
        while (x + (int)left < w && ((row[x + left] ^ p) & 0xFFFFFF) == 0) left++;
      if (up && ((up[x] ^ p) & 0xFFFFFF) == 0 && left < (size_t)(w - x))
        while (x + (int)above < w && ((row[x + above] ^ up[x + above]) & 0xFFFFFF) == 0) above++;
      if (left == 0 && above == 0) {
        put_pixel(&b, p);
        x++;
      } else if (left >= above) {
        put_run(&b, left, left_code, left_len);
        x += (int)left;
      } else {
        put_run(&b, above, up_code, up_len);
        x += (int)above;
      }
    }
  }
  put_bits(&b, 0, 7);  // end of block
  flush_bits(&b);
  at = idat + 10 + b.at;
  put32be(png + at, (uint32_t)(s << 16 | a));
  at = end_chunk(png, idat, at + 4);
  memcpy(png + at + 4, "IEND", 4);
  at = end_chunk(png, at, at + 8);
  *size = at;
  return png;
}

/** The screen, `scale` times its size, as a PNG. */
static uint8_t *screenshot(double scale, size_t *size) {
  struct display d = {0};
  x_open(&d);
  uint32_t *px = x_image(&d);
  int w = d.width, h = d.height;
  if (scale >= 1) return png_encode(px, w, h, (size_t)w, size);
  // Nearest pixel, as the Python helper did (round half to even, the centre of each target pixel).
  int sw = (int)nearbyint(w * scale), sh = (int)nearbyint(h * scale);
  if (sw < 1) sw = 1;
  if (sh < 1) sh = 1;
  uint32_t *small = xmalloc((size_t)sw * sh * 4);
  int *picks = xmalloc(sizeof(int) * (size_t)sw);
  for (int x = 0; x < sw; x++) {
    int sx = (int)((x + 0.5) * w / sw);
    picks[x] = sx < w - 1 ? sx : w - 1;
  }
  for (int y = 0; y < sh; y++) {
    int sy = (int)((y + 0.5) * h / sh);
    const uint32_t *row = px + (size_t)(sy < h - 1 ? sy : h - 1) * w;
    for (int x = 0; x < sw; x++) small[(size_t)y * sw + x] = row[picks[x]];
  }
  return png_encode(small, sw, sh, (size_t)sw, size);
}

static double parse_scale(const char *request) {
  const char *v = member(request, "scale");
  if (!v) return 1;
  char *end;
  double scale = strtod(v, &end);
  if (end == v || !(scale >= 0.05 && scale <= 1)) fail(2, "scale must be within 0.05..1");
  return scale;
}

static char *base64(const uint8_t *in, size_t n, size_t *out_len) {
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *out = xmalloc((n + 2) / 3 * 4 + 1);
  size_t o = 0, i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
    out[o++] = abc[v >> 18], out[o++] = abc[(v >> 12) & 63], out[o++] = abc[(v >> 6) & 63], out[o++] = abc[v & 63];
  }
  if (i < n) {
    uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
    out[o++] = abc[v >> 18], out[o++] = abc[(v >> 12) & 63];
    out[o++] = i + 1 < n ? abc[(v >> 6) & 63] : '=';
    out[o++] = '=';
  }
  *out_len = o;
  return out;
}

/* ---- the resident helper ---- */

/** Runs `helper request` with the request on its stdin (a memfd: the line may be longer than a pipe holds). */
static void run_helper_itself(const char *line, size_t n) {
  int fd = memfd_create("request", 0);
  if (fd < 0) fail(1, "memfd_create: %s", strerror(errno));
  write_all(fd, line, n);
  lseek(fd, 0, SEEK_SET);
  dup2(fd, 0);
  close(fd);
  execl(HELPER, HELPER, "request", (char *)NULL);
  fail(1, "cannot run %s: %s", HELPER, strerror(errno));
}

/** Reads from fd until EOF; its length in *n. */
static char *read_all(int fd, size_t *n) {
  size_t cap = 65536, len = 0;
  char *buf = xmalloc(cap + 1);
  for (;;) {
    if (len == cap) {
      cap *= 2;
      buf = realloc(buf, cap + 1);
      if (!buf) fail(1, "out of memory");
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(1, "read: %s", strerror(errno));
    if (r == 0) break;
    len += (size_t)r;
  }
  buf[len] = 0;
  *n = len;
  return buf;
}

/**
 * Hands the request to the resident helper and prints its answer. An actions request is marked
 * `"screenshotBy":"call"`: the helper then answers `shot <scale>` and the cursor's JSON after the stillness wait, and
 * the screenshot is taken here (compiled: ~5x faster than the helper's own).
 */
static void via_helper(const char *line, size_t n, int actions) {
  const char *port_env = getenv("AGENTVM_DESKTOP_HELPER_PORT");
  int port = port_env && *port_env ? atoi(port_env) : 5999;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    if (fd >= 0) close(fd);
    run_helper_itself(line, n);
  }
  const char *body = line + 1;  // after the object's `{`
  while (*body == ' ' || *body == '\t') body++;
  if (actions) {
    const char *mark = *body == '}' ? "{\"screenshotBy\":\"call\"" : "{\"screenshotBy\":\"call\",";
    write_all(fd, mark, strlen(mark));
    write_all(fd, body, n - (size_t)(body - line));
  } else {
    write_all(fd, line, n);
  }
  shutdown(fd, SHUT_WR);
  size_t len;
  char *answer = read_all(fd, &len);
  close(fd);
  char *nl = memchr(answer, '\n', len);
  if (!nl) fail(1, "%s", len ? answer : "the desktop helper closed the connection");
  *nl = 0;
  char *rest = nl + 1;
  size_t rest_len = len - (size_t)(rest - answer);
  if (strcmp(answer, "ok") == 0) {
    write_all(1, rest, rest_len);
    return;
  }
  if (strncmp(answer, "refused:", 8) == 0) {
    fprintf(stderr, "%s\n", answer);
    exit(2);
  }
  if (strncmp(answer, "shot ", 5) == 0) {
    double scale = strtod(answer + 5, NULL);
    if (!(scale >= 0.05 && scale <= 1)) scale = 1;
    // The helper's JSON object without its closing brace, then the screenshot as the member it would have written.
    while (rest_len > 0 && strchr(" \t\r\n", rest[rest_len - 1])) rest_len--;
    if (rest_len == 0 || rest[rest_len - 1] != '}') fail(1, "the desktop helper answered no JSON object");
    rest_len--;
    size_t png_len, b64_len;
    uint8_t *png = screenshot(scale, &png_len);
    char *b64 = base64(png, png_len, &b64_len);
    write_all(1, rest, rest_len);
    write_all(1, ", \"screenshot\": \"", 17);
    write_all(1, b64, b64_len);
    write_all(1, "\"}", 2);
    return;
  }
  fprintf(stderr, "%s\n", *answer ? answer : "error: the desktop helper closed the connection");
  exit(1);
}

/** The request: stdin up to its first newline (or its end). */
static char *read_line(size_t *n) {
  size_t cap = 4096, len = 0;
  char *buf = xmalloc(cap + 2);
  for (;;) {
    if (len == cap) {
      cap *= 2;
      buf = realloc(buf, cap + 2);
      if (!buf) fail(1, "out of memory");
    }
    ssize_t r = read(0, buf + len, cap - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(1, "read: %s", strerror(errno));
    if (r == 0) break;
    len += (size_t)r;
    if (memchr(buf + len - r, '\n', (size_t)r)) break;
  }
  buf[len] = 0;
  *n = len;
  return buf;
}

int main(void) {
  size_t n;
  char *line = read_line(&n);
  char *nl = memchr(line, '\n', n);
  if (nl) n = (size_t)(nl - line + 1), nl[1] = 0;  // one line: the request
  const char *cmd = member(line, "cmd");
  if (cmd && strncmp(cmd, "\"screenshot\"", 12) == 0) {
    size_t size;
    uint8_t *png = screenshot(parse_scale(line), &size);
    write_all(1, png, size);
    return 0;
  }
  if (!nl) {
    line[n++] = '\n';  // the helper reads a line: give it one (read_line left room)
    line[n] = 0;
  }
  via_helper(line, n, cmd && strncmp(cmd, "\"actions\"", 9) == 0);
  return 0;
}
