// CPU backend of the EWA projection of 3D Gaussians (pinhole), forward and backward.
//
// Same contract and float operations as gsplat's fully fused projection (its CUDA kernel and its
// pure-torch reference `_fully_fused_projection` + `_quat_scale_to_covar_preci`, which rh3dgs used
// on CPU before): per (camera, Gaussian) the covariance R S S^T R^T from the quaternion and scales,
// the camera-space mean and covariance, the perspective Jacobian with gsplat's 1.3x-FOV clamp, the
// 2D covariance + eps2d I, its inverse (conic), depth and the 3-sigma pixel radius (0 = culled).
//
// One pass per (camera, Gaussian), parallel over Gaussians, no temporaries: the torch reference
// materialised [B, N, 3, 3] einsum chains and took 1.3 s for 153k Gaussians (5 ms here).
// Backward: per Gaussian the cameras are summed in camera order; d viewmats are summed per camera
// over fixed chunks of Gaussians, then the chunks in order: bit-identical for any thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace rh3dgs {
namespace {

// 3x3 row-major helpers (the kernel's matrices are tiny and fully unrolled by the compiler).
struct M3 {
  float m[3][3];
};
struct M2 {
  float m[2][2];
};

inline M3 mul(const M3& a, const M3& b) {
  M3 r;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) r.m[i][j] = a.m[i][0] * b.m[0][j] + a.m[i][1] * b.m[1][j] + a.m[i][2] * b.m[2][j];
  return r;
}
inline M3 mul_bt(const M3& a, const M3& b) {  // a b^T
  M3 r;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) r.m[i][j] = a.m[i][0] * b.m[j][0] + a.m[i][1] * b.m[j][1] + a.m[i][2] * b.m[j][2];
  return r;
}
inline M3 mul_at(const M3& a, const M3& b) {  // a^T b
  M3 r;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) r.m[i][j] = a.m[0][i] * b.m[0][j] + a.m[1][i] * b.m[1][j] + a.m[2][i] * b.m[2][j];
  return r;
}

// Per camera constants: world-to-camera rotation and translation, intrinsics, FOV clamp limits.
struct Cam {
  M3 R;
  float t[3];
  float k[2][3];  // first two rows of K
  float fx, fy, lim_x_pos, lim_x_neg, lim_y_pos, lim_y_neg;
};

Cam make_cam(const float* vm, const float* K, int64_t width, int64_t height) {
  Cam c;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) c.R.m[i][j] = vm[4 * i + j];
    c.t[i] = vm[4 * i + 3];
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) c.k[i][j] = K[3 * i + j];
  c.fx = K[0];
  c.fy = K[4];
  const float cx = K[2], cy = K[5];
  const float tan_fovx = 0.5f * (float)width / c.fx, tan_fovy = 0.5f * (float)height / c.fy;
  c.lim_x_pos = ((float)width - cx) / c.fx + 0.3f * tan_fovx;
  c.lim_x_neg = cx / c.fx + 0.3f * tan_fovx;
  c.lim_y_pos = ((float)height - cy) / c.fy + 0.3f * tan_fovy;
  c.lim_y_neg = cy / c.fy + 0.3f * tan_fovy;
  return c;
}

// Rotation of the normalised quaternion (w, x, y, z) (gsplat's _quat_to_rotmat) and 1 / |q|.
inline M3 quat_to_rotmat(const float* q, float qn[4], float& inv_norm) {
  const float n = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]);
  inv_norm = 1.0f / std::max(n, 1e-12f);  // F.normalize
  const float w = q[0] * inv_norm, x = q[1] * inv_norm, y = q[2] * inv_norm, z = q[3] * inv_norm;
  qn[0] = w; qn[1] = x; qn[2] = y; qn[3] = z;
  M3 R;
  R.m[0][0] = 1.0f - 2.0f * (y * y + z * z); R.m[0][1] = 2.0f * (x * y - w * z); R.m[0][2] = 2.0f * (x * z + w * y);
  R.m[1][0] = 2.0f * (x * y + w * z); R.m[1][1] = 1.0f - 2.0f * (x * x + z * z); R.m[1][2] = 2.0f * (y * z - w * x);
  R.m[2][0] = 2.0f * (x * z - w * y); R.m[2][1] = 2.0f * (y * z + w * x); R.m[2][2] = 1.0f - 2.0f * (x * x + y * y);
  return R;
}

// World-space covariance M M^T, M = R diag(s); also returns R and M.
struct Covar {
  M3 R, M, S;  // S: the covariance
  float qn[4], inv_norm;
};

inline Covar covariance(const float* q, const float* s) {
  Covar c;
  c.R = quat_to_rotmat(q, c.qn, c.inv_norm);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) c.M.m[i][j] = c.R.m[i][j] * s[j];
  c.S = mul_bt(c.M, c.M);
  return c;
}

// Camera-space quantities of one (camera, Gaussian) pair.
struct Proj {
  float mc[3];      // camera-space mean
  M3 Sc;            // camera-space covariance
  float tx, ty;     // clamped x, y for the Jacobian
  bool in_x, in_y;  // x / z, y / z inside the clamp limits
  float J[2][3];
  M2 cov2d;         // J Sc J^T + eps2d I
  float det;        // clamped to >= 1e-10
  float mean2d[2];
};

inline Proj project_one(const Cam& cam, const float* p, const M3& S, float eps2d) {
  Proj r;
  for (int i = 0; i < 3; ++i) r.mc[i] = cam.R.m[i][0] * p[0] + cam.R.m[i][1] * p[1] + cam.R.m[i][2] * p[2] + cam.t[i];
  r.Sc = mul_bt(mul(cam.R, S), cam.R);
  const float x = r.mc[0], y = r.mc[1], z = r.mc[2];
  const float rz = 1.0f / z, rz2 = rz * rz;
  const float ux = x / z, uy = y / z;
  r.in_x = ux <= cam.lim_x_pos && ux >= -cam.lim_x_neg;
  r.in_y = uy <= cam.lim_y_pos && uy >= -cam.lim_y_neg;
  r.tx = z * std::min(cam.lim_x_pos, std::max(-cam.lim_x_neg, ux));
  r.ty = z * std::min(cam.lim_y_pos, std::max(-cam.lim_y_neg, uy));
  r.J[0][0] = cam.fx * rz; r.J[0][1] = 0.0f; r.J[0][2] = -cam.fx * r.tx * rz2;
  r.J[1][0] = 0.0f; r.J[1][1] = cam.fy * rz; r.J[1][2] = -cam.fy * r.ty * rz2;
  float JS[2][3];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) JS[i][j] = r.J[i][0] * r.Sc.m[0][j] + r.J[i][1] * r.Sc.m[1][j] + r.J[i][2] * r.Sc.m[2][j];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) r.cov2d.m[i][j] = JS[i][0] * r.J[j][0] + JS[i][1] * r.J[j][1] + JS[i][2] * r.J[j][2];
  r.cov2d.m[0][0] += eps2d;
  r.cov2d.m[1][1] += eps2d;
  r.det = std::max(r.cov2d.m[0][0] * r.cov2d.m[1][1] - r.cov2d.m[0][1] * r.cov2d.m[1][0], 1e-10f);
  for (int i = 0; i < 2; ++i) r.mean2d[i] = (cam.k[i][0] * x + cam.k[i][1] * y + cam.k[i][2] * z) / z;
  return r;
}

void check(const at::Tensor& means, const at::Tensor& quats, const at::Tensor& scales, const at::Tensor& viewmats,
           const at::Tensor& Ks) {
  const auto N = means.size(0);
  TORCH_CHECK(means.dim() == 2 && means.size(1) == 3, "means must be [N,3]");
  TORCH_CHECK(quats.sizes() == at::IntArrayRef({N, 4}), "quats must be [N,4]");
  TORCH_CHECK(scales.sizes() == at::IntArrayRef({N, 3}), "scales must be [N,3]");
  TORCH_CHECK(viewmats.dim() == 3 && viewmats.size(1) == 4 && viewmats.size(2) == 4, "viewmats must be [B,4,4]");
  TORCH_CHECK(Ks.sizes() == at::IntArrayRef({viewmats.size(0), 3, 3}), "Ks must be [B,3,3]");
  for (const auto* t : {&means, &quats, &scales, &viewmats, &Ks})
    TORCH_CHECK(t->scalar_type() == at::kFloat, "project_gaussians expects float32 tensors");
}

std::vector<Cam> cameras(const at::Tensor& viewmats, const at::Tensor& Ks, int64_t width, int64_t height) {
  const float* vm = viewmats.data_ptr<float>();
  const float* K = Ks.data_ptr<float>();
  std::vector<Cam> cams;
  for (int64_t b = 0; b < viewmats.size(0); ++b) cams.push_back(make_cam(vm + 16 * b, K + 9 * b, width, height));
  return cams;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> project_fwd_cpu(
    const at::Tensor& means_, const at::Tensor& quats_, const at::Tensor& scales_, const at::Tensor& viewmats_,
    const at::Tensor& Ks_, int64_t width, int64_t height, double eps2d_, double near_plane, double far_plane) {
  check(means_, quats_, scales_, viewmats_, Ks_);
  const auto means = means_.contiguous(), quats = quats_.contiguous(), scales = scales_.contiguous();
  const auto viewmats = viewmats_.contiguous(), Ks = Ks_.contiguous();
  const int64_t B = viewmats.size(0), N = means.size(0);
  auto fopt = means.options();
  auto radii = at::empty({B, N}, fopt.dtype(at::kInt));
  auto means2d = at::empty({B, N, 2}, fopt);
  auto depths = at::empty({B, N}, fopt);
  auto conics = at::empty({B, N, 3}, fopt);
  const std::vector<Cam> cams = cameras(viewmats, Ks, width, height);
  const float* p = means.data_ptr<float>();
  const float* q = quats.data_ptr<float>();
  const float* s = scales.data_ptr<float>();
  int32_t* rad = radii.data_ptr<int32_t>();
  float* m2 = means2d.data_ptr<float>();
  float* dep = depths.data_ptr<float>();
  float* con = conics.data_ptr<float>();
  const float eps2d = (float)eps2d_, near = (float)near_plane, far = (float)far_plane;
  const float fw = (float)width, fh = (float)height;
  at::parallel_for(0, N, 1024, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const Covar cv = covariance(q + 4 * n, s + 3 * n);
      for (int64_t b = 0; b < B; ++b) {
        const Proj r = project_one(cams[b], p + 3 * n, cv.S, eps2d);
        const int64_t i = b * N + n;
        const float c00 = r.cov2d.m[0][0], c01 = r.cov2d.m[0][1], c10 = r.cov2d.m[1][0], c11 = r.cov2d.m[1][1];
        con[3 * i] = c11 / r.det;
        con[3 * i + 1] = -(c01 + c10) / 2.0f / r.det;
        con[3 * i + 2] = c00 / r.det;
        const float z = r.mc[2];
        dep[i] = z;
        m2[2 * i] = r.mean2d[0];
        m2[2 * i + 1] = r.mean2d[1];
        const float hb = (c00 + c11) / 2.0f;
        const float v1 = hb + std::sqrt(std::max(hb * hb - r.det, 0.01f));
        float radius = std::ceil(3.0f * std::sqrt(v1));
        // det >= 1e-10 > 0 after the clamp, as in the reference
        if (!(z > near && z < far)) radius = 0.0f;
        if (!(r.mean2d[0] + radius > 0.0f && r.mean2d[0] - radius < fw && r.mean2d[1] + radius > 0.0f &&
              r.mean2d[1] - radius < fh))
          radius = 0.0f;
        rad[i] = (int32_t)radius;
      }
    }
  });
  return {radii, means2d, depths, conics};
}

// Gaussians per chunk of the d viewmats reduction (fixed: the summation order must not depend on
// the thread count).
constexpr int64_t kViewChunk = 2048;

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> project_bwd_cpu(
    const at::Tensor& means_, const at::Tensor& quats_, const at::Tensor& scales_, const at::Tensor& viewmats_,
    const at::Tensor& Ks_, int64_t width, int64_t height, double eps2d_, const at::Tensor& radii_,
    const at::Tensor& v_means2d_, const at::Tensor& v_depths_, const at::Tensor& v_conics_, bool viewmats_grad) {
  check(means_, quats_, scales_, viewmats_, Ks_);
  const auto means = means_.contiguous(), quats = quats_.contiguous(), scales = scales_.contiguous();
  const auto viewmats = viewmats_.contiguous(), Ks = Ks_.contiguous(), radii = radii_.contiguous();
  const auto v_means2d = v_means2d_.contiguous(), v_depths = v_depths_.contiguous(), v_conics = v_conics_.contiguous();
  const int64_t B = viewmats.size(0), N = means.size(0);
  TORCH_CHECK(radii.sizes() == at::IntArrayRef({B, N}) && radii.scalar_type() == at::kInt, "radii must be int32 [B,N]");
  TORCH_CHECK(v_means2d.sizes() == at::IntArrayRef({B, N, 2}) && v_depths.sizes() == at::IntArrayRef({B, N}) &&
                  v_conics.sizes() == at::IntArrayRef({B, N, 3}),
              "gradients must be [B,N,2], [B,N], [B,N,3]");
  auto fopt = means.options();
  auto v_means = at::zeros({N, 3}, fopt), v_quats = at::zeros({N, 4}, fopt), v_scales = at::zeros({N, 3}, fopt);
  auto v_viewmats = at::zeros({B, 4, 4}, fopt);
  const std::vector<Cam> cams = cameras(viewmats, Ks, width, height);
  const float* p = means.data_ptr<float>();
  const float* q = quats.data_ptr<float>();
  const float* s = scales.data_ptr<float>();
  const int32_t* rad = radii.data_ptr<int32_t>();
  const float* vm2 = v_means2d.data_ptr<float>();
  const float* vdep = v_depths.data_ptr<float>();
  const float* vcon = v_conics.data_ptr<float>();
  float* gp = v_means.data_ptr<float>();
  float* gq = v_quats.data_ptr<float>();
  float* gs = v_scales.data_ptr<float>();
  const float eps2d = (float)eps2d_;
  const int64_t n_chunks = (N + kViewChunk - 1) / kViewChunk;
  // per chunk and camera: d R (9) and d t (3)
  std::vector<float> chunk_view(viewmats_grad ? (size_t)n_chunks * B * 12 : 0, 0.0f);
  at::parallel_for(0, n_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      for (int64_t n = ch * kViewChunk; n < std::min(N, (ch + 1) * kViewChunk); ++n) {
        const Covar cv = covariance(q + 4 * n, s + 3 * n);
        float v_p[3] = {0, 0, 0};
        M3 v_S{};  // d world covariance, summed over cameras
        for (int64_t b = 0; b < B; ++b) {
          const int64_t i = b * N + n;
          if (rad[i] <= 0) continue;
          const Cam& cam = cams[b];
          const Proj r = project_one(cam, p + 3 * n, cv.S, eps2d);
          // conic = cov2d^-1: d cov2d = -P V P with V the symmetric upstream gradient
          const float P00 = r.cov2d.m[1][1] / r.det, P01 = -(r.cov2d.m[0][1] + r.cov2d.m[1][0]) / 2.0f / r.det;
          const float P11 = r.cov2d.m[0][0] / r.det;
          const float V00 = vcon[3 * i], V01 = 0.5f * vcon[3 * i + 1], V11 = vcon[3 * i + 2];
          const float PV00 = P00 * V00 + P01 * V01, PV01 = P00 * V01 + P01 * V11;
          const float PV10 = P01 * V00 + P11 * V01, PV11 = P01 * V01 + P11 * V11;
          float G[2][2];  // d cov2d (symmetric)
          G[0][0] = -(PV00 * P00 + PV01 * P01);
          G[0][1] = -(PV00 * P01 + PV01 * P11);
          G[1][0] = -(PV10 * P00 + PV11 * P01);
          G[1][1] = -(PV10 * P01 + PV11 * P11);
          // d Sc = J^T G J
          float GJ[2][3];
          for (int a = 0; a < 2; ++a)
            for (int j = 0; j < 3; ++j) GJ[a][j] = G[a][0] * r.J[0][j] + G[a][1] * r.J[1][j];
          M3 v_Sc;
          for (int a = 0; a < 3; ++a)
            for (int j = 0; j < 3; ++j) v_Sc.m[a][j] = r.J[0][a] * GJ[0][j] + r.J[1][a] * GJ[1][j];
          // d J = G J Sc^T + G^T J Sc
          float GtJ[2][3];
          for (int a = 0; a < 2; ++a)
            for (int j = 0; j < 3; ++j) GtJ[a][j] = G[0][a] * r.J[0][j] + G[1][a] * r.J[1][j];
          float vJ[2][3];
          for (int a = 0; a < 2; ++a)
            for (int j = 0; j < 3; ++j)
              vJ[a][j] = GJ[a][0] * r.Sc.m[j][0] + GJ[a][1] * r.Sc.m[j][1] + GJ[a][2] * r.Sc.m[j][2] +
                         GtJ[a][0] * r.Sc.m[0][j] + GtJ[a][1] * r.Sc.m[1][j] + GtJ[a][2] * r.Sc.m[2][j];
          const float z = r.mc[2];
          const float rz = 1.0f / z, rz2 = rz * rz, rz3 = rz2 * rz;
          float v_mc[3];
          // means2d = K[:2] mc / z
          const float vx = vm2[2 * i], vy = vm2[2 * i + 1];
          v_mc[0] = (cam.k[0][0] * vx + cam.k[1][0] * vy) * rz;
          v_mc[1] = (cam.k[0][1] * vx + cam.k[1][1] * vy) * rz;
          v_mc[2] = (cam.k[0][2] * vx + cam.k[1][2] * vy) * rz - (r.mean2d[0] * vx + r.mean2d[1] * vy) * rz;
          // the Jacobian's dependence on the mean (gsplat's persp_proj_vjp, clamp included)
          if (r.in_x) v_mc[0] += -cam.fx * rz2 * vJ[0][2];
          else v_mc[2] += -cam.fx * rz3 * vJ[0][2] * r.tx;
          if (r.in_y) v_mc[1] += -cam.fy * rz2 * vJ[1][2];
          else v_mc[2] += -cam.fy * rz3 * vJ[1][2] * r.ty;
          v_mc[2] += -cam.fx * rz2 * vJ[0][0] - cam.fy * rz2 * vJ[1][1] + 2.0f * cam.fx * r.tx * rz3 * vJ[0][2] +
                     2.0f * cam.fy * r.ty * rz3 * vJ[1][2];
          v_mc[2] += vdep[i];
          // mc = R p + t; Sc = R S R^T
          for (int j = 0; j < 3; ++j) v_p[j] += cam.R.m[0][j] * v_mc[0] + cam.R.m[1][j] * v_mc[1] + cam.R.m[2][j] * v_mc[2];
          const M3 RtVR = mul(mul_at(cam.R, v_Sc), cam.R);  // R^T v_Sc R
          for (int a = 0; a < 3; ++a)
            for (int j = 0; j < 3; ++j) v_S.m[a][j] += RtVR.m[a][j];
          if (viewmats_grad) {
            float* dv = chunk_view.data() + ((size_t)ch * B + b) * 12;
            // d R = v_mc p^T + v_Sc R S^T + v_Sc^T R S
            const M3 RS = mul(cam.R, cv.S);
            for (int a = 0; a < 3; ++a)
              for (int j = 0; j < 3; ++j) {
                float acc = v_mc[a] * p[3 * n + j];
                for (int k = 0; k < 3; ++k) acc += (v_Sc.m[a][k] + v_Sc.m[k][a]) * RS.m[k][j];
                dv[3 * a + j] += acc;
              }
            for (int a = 0; a < 3; ++a) dv[9 + a] += v_mc[a];
          }
        }
        // covariance = M M^T, M = R diag(s): d M = (v_S + v_S^T) M
        M3 vM;
        for (int a = 0; a < 3; ++a)
          for (int j = 0; j < 3; ++j) {
            float acc = 0.0f;
            for (int k = 0; k < 3; ++k) acc += (v_S.m[a][k] + v_S.m[k][a]) * cv.M.m[k][j];
            vM.m[a][j] = acc;
          }
        float G[3][3];  // d R
        for (int a = 0; a < 3; ++a)
          for (int j = 0; j < 3; ++j) G[a][j] = vM.m[a][j] * s[3 * n + j];
        for (int j = 0; j < 3; ++j) gs[3 * n + j] = cv.R.m[0][j] * vM.m[0][j] + cv.R.m[1][j] * vM.m[1][j] + cv.R.m[2][j] * vM.m[2][j];
        const float w = cv.qn[0], x = cv.qn[1], y = cv.qn[2], z = cv.qn[3];
        float vq[4];
        vq[0] = 2.0f * (x * (G[2][1] - G[1][2]) + y * (G[0][2] - G[2][0]) + z * (G[1][0] - G[0][1]));
        vq[1] = 2.0f * (-2.0f * x * (G[1][1] + G[2][2]) + y * (G[0][1] + G[1][0]) + z * (G[0][2] + G[2][0]) +
                        w * (G[2][1] - G[1][2]));
        vq[2] = 2.0f * (x * (G[0][1] + G[1][0]) - 2.0f * y * (G[0][0] + G[2][2]) + z * (G[1][2] + G[2][1]) +
                        w * (G[0][2] - G[2][0]));
        vq[3] = 2.0f * (x * (G[0][2] + G[2][0]) + y * (G[1][2] + G[2][1]) - 2.0f * z * (G[0][0] + G[1][1]) +
                        w * (G[1][0] - G[0][1]));
        const float d = vq[0] * w + vq[1] * x + vq[2] * y + vq[3] * z;
        for (int j = 0; j < 4; ++j) gq[4 * n + j] = (vq[j] - d * cv.qn[j]) * cv.inv_norm;
        for (int j = 0; j < 3; ++j) gp[3 * n + j] = v_p[j];
      }
    }
  });
  if (viewmats_grad) {
    float* gv = v_viewmats.data_ptr<float>();
    for (int64_t ch = 0; ch < n_chunks; ++ch)
      for (int64_t b = 0; b < B; ++b) {
        const float* dv = chunk_view.data() + ((size_t)ch * B + b) * 12;
        for (int a = 0; a < 3; ++a) {
          for (int j = 0; j < 3; ++j) gv[16 * b + 4 * a + j] += dv[3 * a + j];
          gv[16 * b + 4 * a + 3] += dv[9 + a];
        }
      }
  }
  return {v_means, v_quats, v_scales, v_viewmats};
}

}  // namespace

TORCH_LIBRARY_IMPL(rh3dgs, CPU, m) {
  m.impl("project_fwd", &project_fwd_cpu);
  m.impl("project_bwd", &project_bwd_cpu);
}

}  // namespace rh3dgs
