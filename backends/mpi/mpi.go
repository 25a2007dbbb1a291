//go:build mpi

package mpi

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>
#include <time.h>

// Open MPI defines its handles (MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM, MPI_IN_PLACE, ...) as macros over
// addresses of library globals, which cgo cannot evaluate; MPICH defines them as integer constants. These
// small functions hand the handles over (or use them entirely on the C side, like MPI_IN_PLACE, whose fake
// address must never reach Go) and compile against either library.

static MPI_Comm goaccel_comm_world(void) { return MPI_COMM_WORLD; }
static int goaccel_thread_serialized(void) { return MPI_THREAD_SERIALIZED; }

// The kind numbers are backends.ElementKind's.
static MPI_Datatype goaccel_datatype(int kind) {
	switch (kind) {
	case 0: return MPI_FLOAT;
	case 1: return MPI_DOUBLE;
	case 2: return MPI_INT32_T;
	case 3: return MPI_INT64_T;
	case 4: return MPI_UINT8_T;
	case 5: // bfloat16
	case 6: // float16
		return MPI_UINT16_T;
	}
	return MPI_DATATYPE_NULL;
}

// An empty buffer has no address in Go; MPI implementations differ in whether they accept NULL with a zero
// count, so they get the address of this instead.
static char goaccel_empty_buffer[1];
static void *goaccel_buf(void *p) { return p ? p : (void *)goaccel_empty_buffer; }

static int goaccel_init(int *provided) {
	return MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, provided);
}

// Errors on the world communicator (and on every communicator duplicated from it) come back as return codes
// instead of aborting the job from inside MPI.
static int goaccel_errors_return(MPI_Comm comm) {
	return MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
}

// Open MPI 4.1's AVX reduction kernels (the "op avx" component) add 8- and 16-bit integers with saturating
// instructions, so MPI_SUM on MPI_UINT8_T gives 255 instead of wrapping once a buffer is long enough to take
// the vector path (open-mpi/ompi#8045, closed as won't fix). goaccel promises C's and Go's modulo-256 sum on
// every engine, so uint8 sums use this user-defined operation instead.
static void goaccel_sum_uint8(void *in, void *inout, int *len, MPI_Datatype *type) {
	const unsigned char *a = in;
	unsigned char *b = inout;
	for (int i = 0; i < *len; i++) {
		b[i] = (unsigned char)(b[i] + a[i]);
	}
}

// bfloat16 and IEEE binary16 (fp16) have no MPI datatype: buffers travel as MPI_UINT16_T, and their sums
// are user-defined operations that convert each pair to float32, add there and round the sum back to the
// 16-bit format, to nearest with ties to even. MPI applies the operation once per combination of two
// partial results, so a reduction over N ranks rounds N-1 times. The rules are package internal/half's,
// which the in-process engine uses; this package's tests compare the two bit for bit.
static inline float goaccel_f32_from_bits(uint32_t bits) {
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

static inline uint32_t goaccel_bits_of_f32(float f) {
	uint32_t bits;
	memcpy(&bits, &f, sizeof bits);
	return bits;
}

static inline float goaccel_bf16_value(uint16_t h) { return goaccel_f32_from_bits((uint32_t)h << 16); }

static inline uint16_t goaccel_bf16_round(float f) {
	uint32_t bits = goaccel_bits_of_f32(f);
	if ((bits & 0x7fffffffu) > 0x7f800000u) {
		return (uint16_t)((bits >> 16) | 0x0040u); // NaN stays NaN
	}
	return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// The fp16 conversions follow github.com/x448/float16 (f16bitsToF32bits, f32bitsToF16bits).
static inline float goaccel_fp16_value(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (uint32_t)(h & 0x7c00u) >> 10;
	uint32_t coef = (uint32_t)(h & 0x03ffu) << 13;
	if (exp == 0x1f) {
		return goaccel_f32_from_bits(sign | (coef == 0 ? 0x7f800000u : 0x7fc00000u) | coef);
	}
	if (exp == 0) {
		if (coef == 0) {
			return goaccel_f32_from_bits(sign);
		}
		exp++;
		while ((coef & 0x7f800000u) == 0) {
			coef <<= 1;
			exp--;
		}
		coef &= 0x007fffffu;
	}
	return goaccel_f32_from_bits(sign | ((exp + (0x7f - 0xf)) << 23) | coef);
}

static inline uint16_t goaccel_fp16_round(float f) {
	uint32_t u = goaccel_bits_of_f32(f);
	uint32_t sign = u & 0x80000000u, exp = u & 0x7f800000u, coef = u & 0x007fffffu;
	if (exp == 0x7f800000u) {
		uint32_t nan_bit = coef != 0 ? 0x0200u : 0;
		return (uint16_t)((sign >> 16) | 0x7c00u | nan_bit | (coef >> 13));
	}
	uint32_t half_sign = sign >> 16;
	int32_t half_exp = (int32_t)(exp >> 23) - 127 + 15;
	if (half_exp >= 0x1f) {
		return (uint16_t)(half_sign | 0x7c00u);
	}
	if (half_exp <= 0) {
		if (14 - half_exp > 24) {
			return (uint16_t)half_sign;
		}
		uint32_t c = coef | 0x00800000u;
		uint32_t half_coef = c >> (uint32_t)(14 - half_exp);
		uint32_t round_bit = 1u << (uint32_t)(13 - half_exp);
		if ((c & round_bit) != 0 && (c & (3 * round_bit - 1)) != 0) {
			half_coef++;
		}
		return (uint16_t)(half_sign | half_coef);
	}
	uint32_t half_coef = coef >> 13;
	uint32_t round_bit = 0x00001000u;
	uint32_t result = half_sign | ((uint32_t)half_exp << 10) | half_coef;
	if ((coef & round_bit) != 0 && (coef & (3 * round_bit - 1)) != 0) {
		result++;
	}
	return (uint16_t)result;
}

static void goaccel_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type) {
	const uint16_t *a = in;
	uint16_t *b = inout;
	for (int i = 0; i < *len; i++) {
		b[i] = goaccel_bf16_round(goaccel_bf16_value(a[i]) + goaccel_bf16_value(b[i]));
	}
}

static void goaccel_sum_fp16(void *in, void *inout, int *len, MPI_Datatype *type) {
	const uint16_t *a = in;
	uint16_t *b = inout;
	for (int i = 0; i < *len; i++) {
		b[i] = goaccel_fp16_round(goaccel_fp16_value(a[i]) + goaccel_fp16_value(b[i]));
	}
}

static MPI_Op goaccel_op_sum_uint8, goaccel_op_sum_bf16, goaccel_op_sum_fp16;

static int goaccel_create_ops(void) {
	int rc = MPI_Op_create(goaccel_sum_uint8, 1, &goaccel_op_sum_uint8);
	if (rc == MPI_SUCCESS) {
		rc = MPI_Op_create(goaccel_sum_bf16, 1, &goaccel_op_sum_bf16);
	}
	if (rc == MPI_SUCCESS) {
		rc = MPI_Op_create(goaccel_sum_fp16, 1, &goaccel_op_sum_fp16);
	}
	return rc;
}

static int goaccel_free_ops(void) {
	int rc = MPI_Op_free(&goaccel_op_sum_uint8);
	int rc2 = MPI_Op_free(&goaccel_op_sum_bf16);
	int rc3 = MPI_Op_free(&goaccel_op_sum_fp16);
	return rc != MPI_SUCCESS ? rc : rc2 != MPI_SUCCESS ? rc2 : rc3;
}

// goaccel_sum_op is the operation that sums elements of a kind (backends.ElementKind's numbers).
static MPI_Op goaccel_sum_op(int kind) {
	switch (kind) {
	case 4: return goaccel_op_sum_uint8;
	case 5: return goaccel_op_sum_bf16;
	case 6: return goaccel_op_sum_fp16;
	}
	return MPI_SUM;
}

// goaccel_sum_halves applies the 16-bit sum of kind (5 or 6) to two buffers as MPI would, for the tests.
static void goaccel_sum_halves(int kind, void *in, void *inout, int len) {
	if (kind == 5) {
		goaccel_sum_bf16(in, inout, &len, NULL);
	} else {
		goaccel_sum_fp16(in, inout, &len, NULL);
	}
}

static int goaccel_iallreduce_sum(void *buf, int count, int kind, MPI_Comm comm, MPI_Request *req) {
	return MPI_Iallreduce(MPI_IN_PLACE, goaccel_buf(buf), count, goaccel_datatype(kind), goaccel_sum_op(kind), comm, req);
}

static int goaccel_ibcast(void *buf, int count, int kind, int root, MPI_Comm comm, MPI_Request *req) {
	return MPI_Ibcast(goaccel_buf(buf), count, goaccel_datatype(kind), root, comm, req);
}

static int goaccel_iallgather(void *send, void *recv, int count, int kind, MPI_Comm comm, MPI_Request *req) {
	MPI_Datatype t = goaccel_datatype(kind);
	return MPI_Iallgather(goaccel_buf(send), count, t, goaccel_buf(recv), count, t, comm, req);
}

static void goaccel_rings_progress(void);

// goaccel_poll calls once(arg, flag) until it sets *flag or fails, for up to budget_ns and at least 64
// times: non-blocking collectives progress only inside MPI calls, and a C loop drives them at MPI_Wait's
// cadence, where a return to Go between polls leaves the peers' messages waiting (docs/notes.md, Note [MPI
// polling in C]). The bound keeps each call short, so Go's wait loop, its watchdog and its peer checks still
// run: they work at milliseconds to minutes.
static int goaccel_poll(int (*once)(void *, int *), void *arg, int *flag, long long budget_ns) {
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	*flag = 0;
	for (;;) {
		for (int i = 0; i < 64; i++) {
			int rc = once(arg, flag);
			if (rc != MPI_SUCCESS || *flag) {
				return rc;
			}
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		long long elapsed = (long long)(now.tv_sec - start.tv_sec) * 1000000000LL + (now.tv_nsec - start.tv_nsec);
		if (elapsed >= budget_ns) {
			return MPI_SUCCESS;
		}
	}
}

// goaccel_test_once tests an MPI request; every poll also advances goaccel's own rings (below), which MPI
// does not.
static int goaccel_test_once(void *req, int *flag) {
	int rc = MPI_Test((MPI_Request *)req, flag, MPI_STATUS_IGNORE);
	if (rc == MPI_SUCCESS && !*flag) {
		goaccel_rings_progress();
	}
	return rc;
}

// goaccel_test polls an MPI request (goaccel_poll).
static int goaccel_test(MPI_Request *req, int *flag, long long budget_ns) {
	return goaccel_poll(goaccel_test_once, req, flag, budget_ns);
}

// A reduce-scatter as a ring of point-to-point messages. Open MPI's MPI_Ireduce_scatter_block (libnbc)
// reduces the whole buffer to rank 0 along a binomial tree and scatters it from there: every rank mallocs
// two buffers the size of the whole send buffer while it runs. The ring moves (N-1)/N of the buffer out of
// every rank, like the all-reduce's first half, and holds at most two pieces of goaccel_ring_piece_bytes
// per reduce-scatter in flight (docs/notes.md, Note [Reduce-scatter as a ring]).
//
// Rank r's step s (0 <= s <= N-2) sends its partial sum of block (r-s-1) mod N to rank r+1 and receives
// rank r-1's partial sum of block (r-s-2) mod N, to which it adds its own part; after the last step that is
// block r, summed over every rank. Blocks are cut into pieces, each its own run of N-1 steps, so that the
// partial sums in flight stay small whatever the bucket's size. Each block is summed in one fixed order,
// (((x[b+1] + x[b+2]) + x[b+3]) + ...) + x[b], on every run.
//
// MPI progresses its own non-blocking collectives inside any MPI call; a ring moves only when goaccel
// posts its next step. So every live ring is advanced from every poll of any request (goaccel_test and
// goaccel_ring_test), and ranks may wait for their requests in different orders, as MPI allows. Calls hold
// the engine's global mutex, which guards the list too.
enum { goaccel_ring_piece_bytes = 4 << 20 };

typedef struct goaccel_ring {
	MPI_Comm comm;
	MPI_Datatype type;
	MPI_Op op;
	int rank, size, tag;
	size_t elem;          // bytes per element
	const char *send;     // size blocks of `block` elements (pinned Go memory)
	char *recv;           // `block` elements: this rank's block of the sum (pinned Go memory)
	long long block;      // elements per block
	long long piece;      // elements per piece, the most one message carries
	long long offset;     // the current piece's first element within a block
	int step;             // the current step of the current piece's ring
	char *partial[2];     // piece-sized partial sums, one received while the other is sent
	MPI_Request reqs[2];  // the current step's send and receive
	char *dst;            // where the current step receives
	long long count;      // elements in the current piece
	int done;             // this rank's block is complete
	int rc;               // the error that stopped the ring (MPI_SUCCESS while it runs)
	const char *failed;   // the MPI call that returned rc
	struct goaccel_ring *next; // the list of live rings
} goaccel_ring;

// goaccel_live_rings lists the rings started and not yet collected by their request's test.
static goaccel_ring *goaccel_live_rings;

static long long goaccel_mod(long long a, long long n) { return ((a % n) + n) % n; }

static void goaccel_ring_unlink(goaccel_ring *g) {
	for (goaccel_ring **p = &goaccel_live_rings; *p; p = &(*p)->next) {
		if (*p == g) {
			*p = g->next;
			return;
		}
	}
}

// goaccel_ring_post starts the current step's send and receive. When the send cannot start, the receive
// is cancelled and completed, so that no operation of the ring is left pending.
static int goaccel_ring_post(goaccel_ring *g) {
	long long rest = g->block - g->offset;
	g->count = rest < g->piece ? rest : g->piece;
	long long sendBlock = goaccel_mod(g->rank - g->step - 1, g->size);
	const void *src = g->step == 0 ? (const void *)(g->send + (size_t)(sendBlock * g->block + g->offset) * g->elem)
		: (const void *)g->partial[(g->step - 1) & 1];
	g->dst = g->step == g->size - 2 ? g->recv + (size_t)g->offset * g->elem : g->partial[g->step & 1];
	int rc = MPI_Irecv(g->dst, (int)g->count, g->type, (int)goaccel_mod(g->rank - 1, g->size), g->tag, g->comm, &g->reqs[1]);
	if (rc != MPI_SUCCESS) {
		g->failed = "MPI_Irecv";
		return rc;
	}
	rc = MPI_Isend(src, (int)g->count, g->type, (g->rank + 1) % g->size, g->tag, g->comm, &g->reqs[0]);
	if (rc != MPI_SUCCESS) {
		g->failed = "MPI_Isend";
		MPI_Cancel(&g->reqs[1]);
		MPI_Wait(&g->reqs[1], MPI_STATUS_IGNORE);
	}
	return rc;
}

static void goaccel_ring_free(goaccel_ring *g) {
	free(g->partial[0]);
	free(g->partial[1]);
	free(g);
}

// goaccel_ring_advance tests g's current step once and, when both its messages are done, adds this rank's
// part and posts the next step. An error stops the ring, recorded in g->rc.
static void goaccel_ring_advance(goaccel_ring *g) {
	if (g->done || g->rc != MPI_SUCCESS) {
		return;
	}
	int complete;
	int rc = MPI_Testall(2, g->reqs, &complete, MPI_STATUSES_IGNORE);
	if (rc != MPI_SUCCESS) {
		g->rc = rc;
		g->failed = "MPI_Testall";
		return;
	}
	if (!complete) {
		return;
	}
	long long recvBlock = goaccel_mod(g->rank - g->step - 2, g->size);
	rc = MPI_Reduce_local(g->send + (size_t)(recvBlock * g->block + g->offset) * g->elem, g->dst,
		(int)g->count, g->type, g->op);
	if (rc != MPI_SUCCESS) {
		g->rc = rc;
		g->failed = "MPI_Reduce_local";
		return;
	}
	if (++g->step == g->size - 1) {
		g->step = 0;
		g->offset += g->piece;
		if (g->offset >= g->block) {
			g->done = 1;
			return;
		}
	}
	g->rc = goaccel_ring_post(g);
}

static void goaccel_rings_progress(void) {
	for (goaccel_ring *g = goaccel_live_rings; g; g = g->next) {
		goaccel_ring_advance(g);
	}
}

// goaccel_ring_start allocates a ring and posts its first step; *out is NULL when there is nothing to
// exchange (one rank, or empty blocks), the result already in recv. On an error *failed names the MPI call,
// and nothing of the ring is left pending.
static int goaccel_ring_start(void *send, void *recv, long long block, int kind, int tag, MPI_Comm comm,
		goaccel_ring **out, const char **failed) {
	*out = NULL;
	*failed = "MPI_Comm_size";
	int rank, size, elem;
	int rc = MPI_Comm_rank(comm, &rank);
	if (rc == MPI_SUCCESS) {
		rc = MPI_Comm_size(comm, &size);
	}
	if (rc == MPI_SUCCESS) {
		*failed = "MPI_Type_size";
		rc = MPI_Type_size(goaccel_datatype(kind), &elem);
	}
	if (rc != MPI_SUCCESS) {
		return rc;
	}
	if (block == 0) {
		return MPI_SUCCESS;
	}
	if (size == 1) {
		memcpy(recv, send, (size_t)block * elem);
		return MPI_SUCCESS;
	}
	*failed = "malloc";
	goaccel_ring *g = calloc(1, sizeof(goaccel_ring));
	if (g == NULL) {
		return MPI_ERR_NO_MEM;
	}
	g->comm = comm;
	g->type = goaccel_datatype(kind);
	g->op = goaccel_sum_op(kind);
	g->rank = rank;
	g->size = size;
	g->tag = tag;
	g->elem = (size_t)elem;
	g->send = send;
	g->recv = recv;
	g->block = block;
	g->piece = goaccel_ring_piece_bytes / elem;
	if (g->piece > block) {
		g->piece = block;
	}
	// Step s receives into partial[s & 1] except the last (into recv): N = 3 needs one, N > 3 two.
	if (size > 2) {
		g->partial[0] = malloc((size_t)g->piece * elem);
		g->partial[1] = size > 3 ? malloc((size_t)g->piece * elem) : NULL;
		if (g->partial[0] == NULL || (size > 3 && g->partial[1] == NULL)) {
			goaccel_ring_free(g);
			return MPI_ERR_NO_MEM;
		}
	}
	rc = goaccel_ring_post(g);
	if (rc != MPI_SUCCESS) {
		*failed = g->failed;
		goaccel_ring_free(g);
		return rc;
	}
	g->next = goaccel_live_rings;
	goaccel_live_rings = g;
	*out = g;
	return MPI_SUCCESS;
}

// goaccel_ring_once advances every live ring once and reports whether ring g is complete (it is then
// freed). A ring stopped by an error is taken off the list but not freed: MPI may still hold its buffers.
static int goaccel_ring_once(void *arg, int *flag) {
	goaccel_ring *g = arg;
	goaccel_rings_progress();
	if (g->rc != MPI_SUCCESS) {
		goaccel_ring_unlink(g);
		return g->rc;
	}
	if (g->done) {
		goaccel_ring_unlink(g);
		goaccel_ring_free(g);
		*flag = 1;
	}
	return MPI_SUCCESS;
}

// goaccel_ring_test polls ring g as goaccel_test polls a request (goaccel_poll).
static int goaccel_ring_test(goaccel_ring *g, int *flag, long long budget_ns) {
	return goaccel_poll(goaccel_ring_once, g, flag, budget_ns);
}

// goaccel_tag_ub is the largest tag the communicator allows (at least 32767).
static int goaccel_tag_ub(MPI_Comm comm) {
	int *ub, flag;
	if (MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag) != MPI_SUCCESS || !flag) {
		return 32767;
	}
	return *ub;
}

static int goaccel_abort(int code) { return MPI_Abort(MPI_COMM_WORLD, code); }

// Notices (see sidechannel.Messenger) are point-to-point messages on a communicator of their own, so that
// they never match anything of the collectives'.
enum { goaccel_notice_tag = 7 };

static int goaccel_notify(void *buf, int len, int peer, MPI_Comm comm, MPI_Request *req) {
	return MPI_Isend(buf, len, MPI_BYTE, peer, goaccel_notice_tag, comm, req);
}

// goaccel_probe reports whether a notice is waiting, and if so from whom and how long it is.
static int goaccel_probe(MPI_Comm comm, int *flag, int *source, int *count) {
	MPI_Status st;
	int rc = MPI_Iprobe(MPI_ANY_SOURCE, goaccel_notice_tag, comm, flag, &st);
	if (rc != MPI_SUCCESS || !*flag) {
		return rc;
	}
	*source = st.MPI_SOURCE;
	return MPI_Get_count(&st, MPI_BYTE, count);
}

static int goaccel_recv_notice(void *buf, int count, int source, MPI_Comm comm) {
	return MPI_Recv(goaccel_buf(buf), count, MPI_BYTE, source, goaccel_notice_tag, comm, MPI_STATUS_IGNORE);
}

static int goaccel_wait(MPI_Request *req) { return MPI_Wait(req, MPI_STATUS_IGNORE); }
*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/goaccel/goaccel/backends"
	"github.com/goaccel/goaccel/backends/internal/sidechannel"
)

func init() {
	backends.RegisterEngine("mpi", open)
}

// Error is an error code returned by an MPI call, with MPI_Error_string's text.
type Error struct {
	Call string // the MPI function, for example "MPI_Iallreduce"
	Code int
	Text string
}

func (e *Error) Error() string {
	return fmt.Sprintf("mpi: %s failed: %s (error code %d)", e.Call, e.Text, e.Code)
}

// mpiMu is held around every call into MPI. The Communicator already serialises the calls of one engine,
// but a process may hold several engines (and MPI_Init asks only for MPI_THREAD_SERIALIZED, which is
// cheaper than MPI_THREAD_MULTIPLE and all that serialised calls need), so the guarantee has to be global.
// It also guards the fields below.
var mpiMu sync.Mutex

var (
	// engines counts open engines: MPI is finalised when the last one closes.
	engines int
	// initialised is set once initialisation was attempted; initErr is its outcome, returned to every
	// later Open too.
	initialised bool
	initErr     error
	// external: MPI was initialised before the first engine opened, so its owner finalises it.
	external bool
	// finalised: MPI_Finalize ran; MPI cannot be initialised twice in one process.
	finalised bool
	// inflight holds every request whose buffers MPI may still use. Being reachable from a global keeps
	// their pinned buffers alive and keeps runtime.Pinner from panicking about a leak when a request is
	// abandoned (a timed-out wait, an error): those stay pinned for the life of the process, which is short
	// because a failed collective ends the job.
	inflight = map[*request]struct{}{}
)

// check turns an MPI return code into an error. Call it with mpiMu held (MPI_Error_string is an MPI call).
func check(call string, rc C.int) error {
	if rc == C.MPI_SUCCESS {
		return nil
	}
	buf := (*C.char)(C.malloc(C.MPI_MAX_ERROR_STRING))
	defer C.free(unsafe.Pointer(buf))
	var n C.int
	text := "unknown MPI error"
	if C.MPI_Error_string(rc, buf, &n) == C.MPI_SUCCESS {
		text = strings.TrimSpace(C.GoString(buf))
	}
	return &Error{Call: call, Code: int(rc), Text: text}
}

// LibraryVersion returns the MPI library's version text (MPI_Get_library_version), for example
// "Open MPI v4.1.4, package: Debian OpenMPI, ...". MPI allows the call before MPI_Init, so it does not
// initialise MPI.
func LibraryVersion() string {
	mpiMu.Lock()
	defer mpiMu.Unlock()
	buf := (*C.char)(C.malloc(C.MPI_MAX_LIBRARY_VERSION_STRING))
	defer C.free(unsafe.Pointer(buf))
	var n C.int
	if C.MPI_Get_library_version(buf, &n) != C.MPI_SUCCESS {
		return ""
	}
	return strings.TrimSpace(C.GoString(buf))
}

// acquire initialises MPI on the first call and counts the engine. Call it with mpiMu held.
func acquire() error {
	if finalised {
		return fmt.Errorf("mpi: MPI was already finalised in this process (the last engine was closed) and " +
			"cannot be initialised again: open one engine per process and close it at exit")
	}
	if !initialised {
		initialised = true
		initErr = initialise()
	}
	if initErr != nil {
		return initErr
	}
	engines++
	return nil
}

// initialise runs once per process: MPI_Init_thread (unless MPI is already up), the thread-level check,
// and the creation of goaccel's reduction operations.
func initialise() error {
	var flag C.int
	if err := check("MPI_Initialized", C.MPI_Initialized(&flag)); err != nil {
		return err
	}
	var provided C.int
	if flag != 0 {
		external = true
		if err := check("MPI_Query_thread", C.MPI_Query_thread(&provided)); err != nil {
			return err
		}
	} else {
		libraryDefaults()
		if err := check("MPI_Init_thread", C.goaccel_init(&provided)); err != nil {
			return err
		}
	}
	if provided < C.goaccel_thread_serialized() {
		// Go runs goroutines on any OS thread, so MPI_THREAD_FUNNELED or SINGLE would be violated by the
		// first call that happens to run on another thread.
		return fmt.Errorf("mpi: the MPI library provides thread level %d, below MPI_THREAD_SERIALIZED (%d) "+
			"which Go's scheduler needs", int(provided), int(C.goaccel_thread_serialized()))
	}
	return check("MPI_Op_create", C.goaccel_create_ops())
}

// release uncounts an engine and finalises MPI after the last one. Call it with mpiMu held.
func release() error {
	engines--
	if engines > 0 || external {
		return nil
	}
	finalised = true
	err := check("MPI_Op_free", C.goaccel_free_ops())
	if ferr := check("MPI_Finalize", C.MPI_Finalize()); err == nil {
		err = ferr
	}
	return err
}

type engine struct {
	// pollBudget bounds how long one Test polls in C (0: one batch of polls).
	pollBudget time.Duration
	comm       C.MPI_Comm // our duplicate of MPI_COMM_WORLD
	notices    C.MPI_Comm // another duplicate, for notices
	rings      C.MPI_Comm // another duplicate, for the point-to-point messages of goaccel's own collectives
	// ringTags counts the rings started: the next ring's tag, modulo ringTagLimit (MPI_TAG_UB + 1).
	ringTags, ringTagLimit int
	rank, size             int
	closed                 bool
	// sends are the notices sent and their buffers (C memory, which MPI reads until the send completes).
	sends []noticeSend
}

type noticeSend struct {
	handle *C.MPI_Request
	buf    unsafe.Pointer
}

// open is the EngineFactory. The topology is not used to set anything up (MPI knows its ranks from the
// launcher); backends.Open compares the two afterwards.
// pollBudget is how long one Test polls in C when every rank of the node has a core. Ranks outnumbering
// the cores poll once per Test instead, and the communicator yields between Tests so their peers run:
// spinning in C there starved them (docs/notes.md, Note [MPI polling in C]).
const pollBudget = 200 * time.Microsecond

func open(topo backends.Topology) (backends.Engine, error) {
	mpiMu.Lock()
	defer mpiMu.Unlock()
	if err := acquire(); err != nil {
		return nil, err
	}
	e := &engine{pollBudget: pollBudget}
	if topo.Oversubscribed() {
		e.pollBudget = 0
	}
	if err := e.setUp(); err != nil {
		_ = release()
		return nil, err
	}
	return e, nil
}

func (e *engine) setUp() error {
	world := C.goaccel_comm_world()
	if err := check("MPI_Comm_set_errhandler", C.goaccel_errors_return(world)); err != nil {
		return err
	}
	// A duplicate keeps our collectives from matching those of any other MPI user in the process; it
	// inherits MPI_ERRORS_RETURN.
	if err := check("MPI_Comm_dup", C.MPI_Comm_dup(world, &e.comm)); err != nil {
		return err
	}
	if err := check("MPI_Comm_dup", C.MPI_Comm_dup(world, &e.notices)); err != nil {
		return err
	}
	if err := check("MPI_Comm_dup", C.MPI_Comm_dup(world, &e.rings)); err != nil {
		return err
	}
	e.ringTagLimit = int(C.goaccel_tag_ub(e.rings)) + 1
	var rank, size C.int
	if err := check("MPI_Comm_rank", C.MPI_Comm_rank(e.comm, &rank)); err != nil {
		return err
	}
	if err := check("MPI_Comm_size", C.MPI_Comm_size(e.comm, &size)); err != nil {
		return err
	}
	e.rank, e.size = int(rank), int(size)
	return nil
}

// SetOversubscribed makes Test poll once instead of spinning: backends.Open found more ranks on this
// kernel than processors, which the launcher's topology did not say.
func (e *engine) SetOversubscribed() {
	mpiMu.Lock()
	defer mpiMu.Unlock()
	e.pollBudget = 0
}

func (e *engine) Rank() int { return e.rank }
func (e *engine) Size() int { return e.size }

// request is one non-blocking MPI collective.
type request struct {
	eng    *engine
	call   string
	handle *C.MPI_Request  // C memory: MPI writes the request's completion into it asynchronously
	ring   *C.goaccel_ring // instead of handle: a collective goaccel runs as point-to-point messages
	pinner runtime.Pinner
	done   bool
	err    error
}

// start pins the buffers, allocates the request handle and calls startFn. Call it with mpiMu held.
func (e *engine) start(call string, startFn func(handle *C.MPI_Request) C.int, bufs ...backends.Buffer) (backends.Request, error) {
	if err := e.checkStart(call, bufs); err != nil {
		return nil, err
	}
	r := &request{eng: e, call: call, handle: (*C.MPI_Request)(C.malloc(C.sizeof_MPI_Request))}
	r.pin(bufs)
	if err := check(call, startFn(r.handle)); err != nil {
		// MPI did not take the request, so it holds no reference to the buffers.
		r.pinner.Unpin()
		C.free(unsafe.Pointer(r.handle))
		return nil, err
	}
	inflight[r] = struct{}{}
	return r, nil
}

// checkStart refuses a collective on a closed engine or on a buffer longer than MPI's counts reach.
func (e *engine) checkStart(call string, bufs []backends.Buffer) error {
	if e.closed {
		return backends.ErrClosed
	}
	for _, b := range bufs {
		if b.Len > math.MaxInt32 {
			return fmt.Errorf("mpi: %s of %d elements exceeds MPI's int count limit (%d); split the buffer",
				call, b.Len, math.MaxInt32)
		}
	}
	return nil
}

// pin keeps the buffers where MPI was told they are until the request completes.
func (r *request) pin(bufs []backends.Buffer) {
	for _, b := range bufs {
		if b.Ptr != nil {
			r.pinner.Pin(b.Ptr)
		}
	}
}

// Test progresses MPI and reports whether the request completed.
func (r *request) Test() (bool, error) { return r.test(r.eng.pollBudget) }

// Poll implements backends.Poller: one batch of MPI_Test calls, without Test's time budget, for a goroutine
// that keeps the collective progressing while the program computes.
func (r *request) Poll() (bool, error) { return r.test(0) }

func (r *request) test(budget time.Duration) (bool, error) {
	if r.done {
		return true, r.err
	}
	mpiMu.Lock()
	defer mpiMu.Unlock()
	var flag C.int
	call := "MPI_Test"
	var rc C.int
	if r.ring != nil {
		rc = C.goaccel_ring_test(r.ring, &flag, C.longlong(budget.Nanoseconds()))
		if rc != C.MPI_SUCCESS && r.ring.failed != nil {
			call = C.GoString(r.ring.failed)
		}
	} else {
		rc = C.goaccel_test(r.handle, &flag, C.longlong(budget.Nanoseconds()))
	}
	if err := check(call, rc); err != nil {
		// The request's state is unknown, so its buffers stay pinned and listed in inflight.
		r.done, r.err = true, fmt.Errorf("%s: %w", r.call, err)
		return true, r.err
	}
	if flag == 0 {
		return false, nil
	}
	r.done = true
	delete(inflight, r)
	r.pinner.Unpin()
	if r.ring != nil {
		r.ring = nil // goaccel_ring_test freed it on completion
	} else {
		C.free(unsafe.Pointer(r.handle))
		r.handle = nil
	}
	return true, nil
}

func (e *engine) StartAllReduceSum(b backends.Buffer) (backends.Request, error) {
	mpiMu.Lock()
	defer mpiMu.Unlock()
	return e.start("MPI_Iallreduce", func(h *C.MPI_Request) C.int {
		return C.goaccel_iallreduce_sum(b.Ptr, C.int(b.Len), C.int(b.Kind), e.comm, h)
	}, b)
}

func (e *engine) StartReduceScatterSum(send, recv backends.Buffer) (backends.Request, error) {
	if send.Kind != recv.Kind || send.Len != recv.Len*e.size {
		return nil, fmt.Errorf("mpi: reduce-scatter of %s[%d] over %d ranks needs a %s[%d] receive buffer, got %s[%d]",
			send.Kind, send.Len, e.size, send.Kind, send.Len/max(e.size, 1), recv.Kind, recv.Len)
	}
	mpiMu.Lock()
	defer mpiMu.Unlock()
	// Rings started in the same order on every rank (as every collective is) get the same tag, and rings in
	// flight at once get different ones, so their messages never match each other's: the tags go round
	// MPI_TAG_UB (2^31 − 1 in Open MPI), far more rings than a neighbour can lag behind.
	tag := e.ringTags % e.ringTagLimit
	e.ringTags++
	return e.startRing("reduce-scatter", func(ring **C.goaccel_ring, failed **C.char) C.int {
		return C.goaccel_ring_start(send.Ptr, recv.Ptr, C.longlong(recv.Len), C.int(recv.Kind), C.int(tag), e.rings,
			ring, failed)
	}, send, recv)
}

// startRing is start for a collective goaccel runs itself as point-to-point messages (a goaccel_ring): it
// pins the buffers and starts the ring. Call it with mpiMu held.
func (e *engine) startRing(call string, startFn func(ring **C.goaccel_ring, failed **C.char) C.int, bufs ...backends.Buffer) (backends.Request, error) {
	if err := e.checkStart(call, bufs); err != nil {
		return nil, err
	}
	r := &request{eng: e, call: call}
	r.pin(bufs)
	// C memory, both; the address of a field of r would be Go memory holding Go pointers.
	var ring *C.goaccel_ring
	var failed *C.char
	if rc := startFn(&ring, &failed); rc != C.MPI_SUCCESS {
		// Nothing of the ring is pending (goaccel_ring_start cancels what it posted), so MPI holds no
		// reference to the buffers.
		r.pinner.Unpin()
		return nil, fmt.Errorf("%s: %w", call, check(C.GoString(failed), rc))
	}
	r.ring = ring
	if ring == nil {
		// Nothing to exchange: the result is already in place.
		r.pinner.Unpin()
		r.done = true
		return r, nil
	}
	inflight[r] = struct{}{}
	return r, nil
}

func (e *engine) StartBroadcast(b backends.Buffer, root int) (backends.Request, error) {
	mpiMu.Lock()
	defer mpiMu.Unlock()
	return e.start("MPI_Ibcast", func(h *C.MPI_Request) C.int {
		return C.goaccel_ibcast(b.Ptr, C.int(b.Len), C.int(b.Kind), C.int(root), e.comm, h)
	}, b)
}

func (e *engine) StartAllGather(send, recv backends.Buffer) (backends.Request, error) {
	if send.Kind != recv.Kind || recv.Len != send.Len*e.size {
		return nil, fmt.Errorf("mpi: all-gather of %s[%d] over %d ranks needs a %s[%d] receive buffer, got %s[%d]",
			send.Kind, send.Len, e.size, send.Kind, send.Len*e.size, recv.Kind, recv.Len)
	}
	mpiMu.Lock()
	defer mpiMu.Unlock()
	return e.start("MPI_Iallgather", func(h *C.MPI_Request) C.int {
		return C.goaccel_iallgather(send.Ptr, recv.Ptr, C.int(send.Len), C.int(send.Kind), e.comm, h)
	}, send, recv)
}

func (e *engine) StartBarrier() (backends.Request, error) {
	mpiMu.Lock()
	defer mpiMu.Unlock()
	return e.start("MPI_Ibarrier", func(h *C.MPI_Request) C.int { return C.MPI_Ibarrier(e.comm, h) })
}

// sumHalves adds in into inout, element by element, with the engine's sum for 16-bit kind (BFloat16 or
// Float16): the C function MPI calls during a reduction, called directly and without MPI, so tests can
// compare it with package half's rules.
func sumHalves(kind backends.ElementKind, in, inout backends.Buffer) error {
	if (kind != backends.BFloat16 && kind != backends.Float16) || in.Kind != kind || inout.Kind != kind || in.Len != inout.Len {
		return fmt.Errorf("mpi: a 16-bit sum of %s needs two %s buffers of one length, got %s[%d] and %s[%d]",
			kind, kind, in.Kind, in.Len, inout.Kind, inout.Len)
	}
	if in.Len > 0 {
		C.goaccel_sum_halves(C.int(kind), in.Ptr, inout.Ptr, C.int(in.Len))
	}
	return nil
}

// Abort asks MPI to end every rank of the job. mpiMu is not taken: another goroutine may be stuck holding
// it, and aborting is exactly what must still work then.
func (e *engine) Abort(code int) {
	C.goaccel_abort(C.int(code))
	// MPI_Abort does not return in practice; if it does, at least this rank ends.
	os.Exit(code)
}

// Notify sends msg to every other rank (sidechannel.Messenger) without waiting for it to be received.
func (e *engine) Notify(msg []byte) error {
	mpiMu.Lock()
	defer mpiMu.Unlock()
	if e.closed {
		return backends.ErrClosed
	}
	for peer := range e.size {
		if peer == e.rank {
			continue
		}
		s := noticeSend{handle: (*C.MPI_Request)(C.malloc(C.sizeof_MPI_Request)), buf: C.CBytes(msg)}
		if err := check("MPI_Isend", C.goaccel_notify(s.buf, C.int(len(msg)), C.int(peer), e.notices, s.handle)); err != nil {
			C.free(s.buf)
			C.free(unsafe.Pointer(s.handle))
			return err
		}
		e.sends = append(e.sends, s)
	}
	return nil
}

// Notices returns the notices that arrived (sidechannel.Messenger), without blocking.
func (e *engine) Notices() ([]sidechannel.Notice, error) {
	mpiMu.Lock()
	defer mpiMu.Unlock()
	if e.closed {
		return nil, backends.ErrClosed
	}
	var out []sidechannel.Notice
	for {
		var flag, source, count C.int
		if err := check("MPI_Iprobe", C.goaccel_probe(e.notices, &flag, &source, &count)); err != nil {
			return out, err
		}
		if flag == 0 {
			return out, nil
		}
		buf := make([]byte, int(count))
		var p runtime.Pinner
		var ptr unsafe.Pointer
		if len(buf) > 0 {
			ptr = unsafe.Pointer(&buf[0])
			p.Pin(ptr)
		}
		err := check("MPI_Recv", C.goaccel_recv_notice(ptr, count, source, e.notices))
		p.Unpin()
		if err != nil {
			return out, err
		}
		out = append(out, sidechannel.Notice{From: int(source), Msg: buf})
	}
}

// Close frees the communicator and finalises MPI when this was the last engine. With collectives still in
// flight MPI cannot be finalised safely: Close then reports them and leaves MPI alone, and the launcher
// treats the process's exit without MPI_Finalize as a failure of the job.
func (e *engine) Close() error {
	mpiMu.Lock()
	defer mpiMu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	n := 0
	for r := range inflight {
		if r.eng == e {
			n++
		}
	}
	if n > 0 {
		return fmt.Errorf("mpi: closing with %d collective(s) still in flight; MPI is not finalised", n)
	}
	// Every peer received this rank's notice before it closed (the Communicator closes only once all
	// ranks announced), so the sends complete; MPI must not be finalised with them pending.
	var err error
	for _, s := range e.sends {
		if werr := check("MPI_Wait", C.goaccel_wait(s.handle)); err == nil {
			err = werr
		}
		C.free(s.buf)
		C.free(unsafe.Pointer(s.handle))
	}
	e.sends = nil
	if ferr := check("MPI_Comm_free", C.MPI_Comm_free(&e.notices)); err == nil {
		err = ferr
	}
	if ferr := check("MPI_Comm_free", C.MPI_Comm_free(&e.rings)); err == nil {
		err = ferr
	}
	if ferr := check("MPI_Comm_free", C.MPI_Comm_free(&e.comm)); err == nil {
		err = ferr
	}
	if rerr := release(); err == nil {
		err = rerr
	}
	return err
}
