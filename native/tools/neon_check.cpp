// arm64 cross-check of the NEON kernels (they are not compiled on x86): NEON == scalar, bit for bit,
// for the SLB scan/search, the RoPE rotation (NORM/NEOX, FMA and plain, partial n_rot, in place and
// out of place) and the streaming byte sum. Not part of the Python build or the pytest suite.
//
//   apt-get install g++-aarch64-linux-gnu qemu-user
//   S=native/src/cpp
//   aarch64-linux-gnu-g++ -std=c++17 -O2 -ffp-contract=off -static -I$S native/tools/neon_check.cpp \
//       $S/slb.cpp $S/rope.cpp $S/util.cpp -o /tmp/neon_check && qemu-aarch64 /tmp/neon_check
//   (add -march=armv8.2-a+dotprod and run with `qemu-aarch64 -cpu max` for the SDOT path)
#include "slb.hpp"
#include "rope.hpp"
#include "util.hpp"
#include <cstdio>
#include <random>
#include <vector>
#include <cstring>
using namespace nx;
int main() {
    std::mt19937 rng(7); std::normal_distribution<float> nd;
    int fails = 0;
    printf("best isa: %s\n", isa_name(best_isa()));
    for (size_t dim : {1, 15, 16, 17, 64, 100, 384}) {
        const size_t n = 37;
        std::vector<float> x(n * dim); for (auto& v : x) v = nd(rng);
        std::vector<int64_t> ids(n); for (size_t i = 0; i < n; ++i) ids[i] = (int64_t)(i * 3 % n);
        Int8Index a(dim, 0, Isa::Scalar), b(dim, 0, Isa::Neon);
        a.add(x.data(), n, ids.data()); b.add(x.data(), n, ids.data());
        std::vector<float> sa(n), sb(n);
        for (size_t t = 0; t < 5; ++t) {
            a.scores(x.data() + t * dim, sa.data()); b.scores(x.data() + t * dim, sb.data());
            if (memcmp(sa.data(), sb.data(), n * 4)) { printf("scores differ dim=%zu\n", dim); ++fails; }
            int64_t ia[10], ib[10]; float fa[10], fb[10];
            size_t ka = a.search(x.data() + t * dim, 10, ia, fa), kb = b.search(x.data() + t * dim, 10, ib, fb);
            if (ka != kb || memcmp(ia, ib, ka * 8) || memcmp(fa, fb, ka * 4)) { printf("search differs dim=%zu\n", dim); ++fails; }
        }
    }
    for (RopeType rt : {RopeType::Norm, RopeType::Neox}) for (bool fused : {true, false}) for (uint32_t n_rot : {64u, 40u, 6u}) {
        ModelSpec s; s.n_layer = 1; s.n_head_kv = 3; s.head_dim = 64; s.n_rot = n_rot; s.rope_type = rt; s.freq_base = 1e4f;
        std::vector<uint16_t> k(20 * 3 * 64); for (auto& v : k) v = float_to_half(nd(rng) * 3);
        std::vector<uint16_t> a = k, b = k, c(k.size());
        rope_reanchor_f16(a.data(), 60, s, 1234, Isa::Scalar, fused);
        rope_reanchor_f16(b.data(), 60, s, 1234, Isa::Neon, fused);
        std::vector<float> cache(n_rot); rope_cache(s, 1234, cache.data(), fused);
        rope_rotate_f16(k.data(), c.data(), 60, 64, n_rot, rt, cache.data(), Isa::Neon, fused);
        if (a != b || a != c) { printf("rope differs type=%u fused=%d n_rot=%u\n", (unsigned)rt, fused, n_rot); ++fails; }
    }
    std::vector<uint8_t> buf(100003); for (auto& v : buf) v = rng() & 255;
    uint64_t s = 0; for (auto v : buf) s += v;
    if (memory_read_sum(buf.data(), buf.size()) != s) { printf("read sum differs\n"); ++fails; }
    printf("%d failures\n", fails);
    return fails != 0;
}
