"""Marine-navigation dynamics, currents, perception, collisions, rewards and COLREGs by hand computation.

Each test builds a small scenario by hand with noise-free perception, so every number is a closed form or a
short scalar recursion of the model written out here (``docs/marinenav.md`` sections 2 to 6).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rl_lightning.envs.marinenav import MarineNavBatch, Scenario, split_observation
from rl_lightning.envs.marinenav import constants as C

RADIUS = 0.5 * math.hypot(5.0, 2.5)
FULL_AHEAD = 24  # (+1000, +1000) N/s
COAST = 0  # thrusts unchanged


def make_sim(scenario: Scenario, *, continuous: bool = False, robots: int | None = None) -> MarineNavBatch:
    sim = MarineNavBatch(
        1,
        robots or scenario.num_robots,
        max(len(scenario.obstacles), 1),
        max(len(scenario.cores), 1),
        continuous=continuous,
        perception_noise=False,
    )
    sim.reset([scenario])
    return sim


def straight_run(force: float, steps: int) -> tuple[list[float], list[float], list[float]]:
    """Surge-only model by hand, from rest at x = 0: positions, speeds after each step and the speed the
    observation reports (the one at the last sub-step's start)."""
    x, u, xs, us, lagged = 0.0, 0.0, [], [], []
    for _ in range(steps):
        for _ in range(C.SUBSTEPS):
            start = u
            x += u * C.DT
            u += C.DT * (force - (100.0 + 150.0 * abs(u)) * u) / 380.0
        xs.append(x)
        us.append(u)
        lagged.append(start)
    return xs, us, lagged


def test_discrete_actions_map_to_thrust_changes_and_clip() -> None:
    assert C.DISCRETE_THRUST_CHANGES.shape == (25, 2)
    assert tuple(C.DISCRETE_THRUST_CHANGES[7]) == (-500.0, -1000.0)  # 5 * 1 + 2
    assert tuple(C.DISCRETE_THRUST_CHANGES[FULL_AHEAD]) == (1000.0, 1000.0)
    sim = make_sim(Scenario.make([[10, 10]], [[50, 50]], [0.0]))
    thrusts = []
    for action in (FULL_AHEAD, FULL_AHEAD, FULL_AHEAD, 12, 12, 12, 12):  # 12: (-1000, -1000)
        sim.step(np.array([[action]]))
        thrusts.append(sim.thrust[0, 0, 0])
    # +500 per step up to the 1000 N cap, then -500 per step down to the -500 N floor.
    assert thrusts == [500.0, 1000.0, 1000.0, 500.0, 0.0, -500.0, -500.0]


def test_continuous_actions_scale_by_1000_per_second_and_clip_to_the_box() -> None:
    sim = make_sim(Scenario.make([[10, 10]], [[50, 50]], [0.0]), continuous=True)
    sim.step(np.array([[[0.4, -0.2]]]))
    np.testing.assert_allclose(sim.thrust[0, 0], [200.0, -100.0])
    sim.step(np.array([[[3.0, -3.0]]]))  # clipped to [1, -1]: +500 and -500 N
    np.testing.assert_allclose(sim.thrust[0, 0], [700.0, -500.0])


def test_straight_run_follows_the_surge_equation_and_reports_the_lagged_speed() -> None:
    sim = make_sim(Scenario.make([[10, 10]], [[50, 10]], [0.0]))
    xs, us, lagged = straight_run(1000.0, 1)
    result = sim.step(np.array([[FULL_AHEAD]]))
    assert sim.pos[0, 0, 0] - 10.0 == pytest.approx(xs[0], abs=1e-12)
    assert sim.pos[0, 0, 1] == 10.0 and sim.theta[0, 0] == 0.0
    assert sim.vel_r[0, 0, 0] == pytest.approx(us[0], abs=1e-12)
    own, _, _ = split_observation(result.obs[0, 0])
    # Goal 40 - x ahead; the reported speed is one sub-step older than the state's.
    np.testing.assert_allclose(own, [40.0 - xs[0], 0.0, lagged[0], 0.0, 0.0, 500.0, 500.0], rtol=1e-6)
    assert lagged[0] < us[0]
    # Top speed at 2000 N: (100 + 150 u) u = 2000 -> u = 10/3.
    for _ in range(60):
        sim.step(np.array([[FULL_AHEAD]]))
    assert sim.vel_r[0, 0, 0] == pytest.approx(10.0 / 3.0, rel=1e-4)


def test_differential_thrust_turns_towards_the_weaker_thruster_side() -> None:
    # Left thruster only: yaw moment (T_L - T_R) * width / 2 > 0, so the heading grows (counter-clockwise).
    sim = make_sim(Scenario.make([[10, 10]], [[50, 10]], [0.1]))
    sim.step(np.array([[20]]))  # (+1000, 0)
    assert tuple(sim.thrust[0, 0]) == (500.0, 0.0)
    # First sub-step's yaw acceleration: 625 N m / (450 + 980); rate after ten sub-steps by hand.
    w = 0.0
    for _ in range(C.SUBSTEPS):
        w += C.DT * (625.0 - (980.0 + 950.0 * abs(w)) * w) / 1430.0
    # The sway-yaw coupling X_u̇ u_r v_r is second order here; the rate matches to 1e-3.
    assert sim.vel_r[0, 0, 2] == pytest.approx(w, rel=1e-3)
    assert sim.theta[0, 0] > 0.1


def test_heading_wraps_into_zero_two_pi() -> None:
    sim = make_sim(Scenario.make([[10, 10]], [[50, 10]], [2 * math.pi - 1e-3]))
    sim.vel_r[0, 0, 2] = sim.vel[0, 0, 2] = 0.5
    sim.step(np.array([[COAST]]))
    assert 0.0 <= sim.theta[0, 0] < 0.3  # about 0.2 rad past north-east of 2π, not 2π + 0.2


@pytest.mark.parametrize("clockwise", [True, False])
def test_vortex_current_by_hand(clockwise: bool) -> None:
    gamma = 2 * math.pi * C.CORE_R * 3.0  # 3 m/s at the rim
    scenario = Scenario.make([[12, 10]], [[50, 50]], [0.0], cores=[[10, 10, float(clockwise), gamma]])
    sim = make_sim(scenario)
    sign = 1.0 if clockwise else -1.0
    # East of a clockwise core the water flows south, at Γ / (2π d) = 0.75 m/s for d = 2.
    np.testing.assert_allclose(sim._current_at(sim.pos)[0, 0], [0.0, -0.75 * sign], atol=1e-12)
    # Inside the core the speed grows linearly: Γ d / (2π r_c²) = 1.5 m/s at d = 0.25.
    inside = np.array([[[10.25, 10.0]]])
    np.testing.assert_allclose(sim._current_at(inside)[0, 0], [0.0, -1.5 * sign], atol=1e-12)
    np.testing.assert_allclose(sim._current_at(np.array([[[10.0, 10.0]]]))[0, 0], [0.0, 0.0])
    # North of the core: (-0.75, 0) for clockwise, i.e. west.
    np.testing.assert_allclose(
        sim._current_at(np.array([[[10.0, 12.0]]]))[0, 0], [0.75 * sign, 0.0], atol=1e-12
    )


def test_two_cores_add_and_a_drifting_robot_moves_with_the_water() -> None:
    gamma = 3 * math.pi
    cores = [[10, 10, 1.0, gamma], [30, 10, 0.0, gamma]]
    scenario = Scenario.make([[20, 30]], [[50, 50]], [0.0], cores=cores)
    sim = make_sim(scenario)

    def current(p: np.ndarray) -> np.ndarray:
        total = np.zeros(2)
        for cx, cy, cw, g in cores:
            n = (np.array([cx, cy]) - p) / math.hypot(cx - p[0], cy - p[1])
            t = np.array([-n[1], n[0]]) if cw else np.array([n[1], -n[0]])
            total += g / (2 * math.pi * math.hypot(cx - p[0], cy - p[1])) * t
        return total

    p = np.array([20.0, 30.0])
    np.testing.assert_allclose(sim.vel[0, 0, :2], current(p), atol=1e-12)  # at rest in the water
    for _ in range(C.SUBSTEPS):
        p = p + current(p) * C.DT
    sim.step(np.array([[COAST]]))  # no thrust, no rotation: no force acts, the robot drifts
    np.testing.assert_allclose(sim.pos[0, 0], p, atol=1e-12)
    np.testing.assert_allclose(sim.vel_r[0, 0], 0.0, atol=1e-12)


def test_perception_orders_nearest_first_pads_and_uses_the_robot_frame() -> None:
    obstacles = [[10, 22, 1.0], [10, 14, 1.0], [4, 10, 2.0], [10, 40, 1.0]]  # the last one is out of range
    scenario = Scenario.make([[10, 10]], [[40, 10]], [math.pi / 2], obstacles=obstacles)
    sim = make_sim(scenario)
    _, objects, mask = split_observation(sim.observe()[0, 0])
    np.testing.assert_array_equal(mask, [1, 1, 1, 0, 0])
    # Heading north: the robot frame's x is north and y is west. Gaps: 4-1-R, 6-2-R, 12-1-R.
    np.testing.assert_allclose(objects[0], [4.0, 0.0, 0.0, 0.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(objects[1], [0.0, 6.0, 0.0, 0.0, 2.0], atol=1e-5)
    np.testing.assert_allclose(objects[2], [12.0, 0.0, 0.0, 0.0, 1.0], atol=1e-5)
    np.testing.assert_array_equal(objects[3:], 0.0)
    own, _, _ = split_observation(sim.observe()[0, 0])
    np.testing.assert_allclose(own[:2], [0.0, -30.0], atol=1e-5)  # the goal is east: the robot's right


def test_detection_range_is_20_m_plus_the_radius() -> None:
    scenario = Scenario.make([[10, 10]], [[40, 40]], [0.0], obstacles=[[30.9, 10, 1.0], [10, 31.1, 1.0]])
    _, _, mask = split_observation(make_sim(scenario).observe()[0, 0])
    np.testing.assert_array_equal(mask, [1, 0, 0, 0, 0])


def test_other_vessels_are_seen_with_their_velocity_in_the_robot_frame() -> None:
    scenario = Scenario.make([[10, 10], [10, 20]], [[50, 10], [50, 50]], [0.0, math.pi / 2])
    sim = make_sim(scenario)
    sim.vel[0, 1, :2] = [1.0, 2.0]
    _, objects, mask = split_observation(sim.observe()[0, 0])
    np.testing.assert_array_equal(mask, [1, 0, 0, 0, 0])
    np.testing.assert_allclose(objects[0], [0.0, 10.0, 1.0, 2.0, RADIUS], atol=1e-5)
    _, objects, _ = split_observation(sim.observe()[0, 1])
    # Robot 1 heads north: robot 0 (10 m south, at rest) is 10 m behind it.
    np.testing.assert_allclose(objects[0], [-10.0, 0.0, 0.0, 0.0, RADIUS], atol=1e-5)


def test_noisy_radius_lies_in_its_band_and_positions_scatter_by_five_cm() -> None:
    obstacles = [[10 + 3 * (k % 4), 30 + 3 * (k // 4), 1.0] for k in range(8)]
    scenario = Scenario.make([[10, 10]], [[50, 50]], [0.0], obstacles=obstacles)
    sim = MarineNavBatch(1, 1, 8, 1, perception_noise=True)
    sim.seed(0)
    sim.reset([scenario])
    radii = []
    for _ in range(300):
        obs = sim.observe()[0, 0]
        _, objects, mask = split_observation(obs.astype(np.float64))
        radii.extend(objects[mask > 0, 4])
    radii = np.array(radii)
    assert radii.min() >= 0.6 - 1e-6 and radii.max() <= 1.0 + 1e-6
    assert radii.mean() == pytest.approx(0.8, abs=0.01)
    pos, _, _ = sim._noise((1, 2, 4000))
    errors = pos.reshape(-1)
    assert errors.std() == pytest.approx(C.POS_STD, rel=0.05)


def surge_positions(steps: int, ramp: bool = True) -> list[float]:
    """x displacement after each of ``steps`` full-ahead steps from rest, by the surge recursion: the
    thrusts ramp to 500 N each after the first action and 1000 N each from the second on."""
    x, u, out = 0.0, 0.0, []
    for k in range(steps):
        force = 1000.0 if (k == 0 and ramp) else 2000.0
        for _ in range(C.SUBSTEPS):
            x += u * C.DT
            u += C.DT * (force - (100.0 + 150.0 * abs(u)) * u) / 380.0
        out.append(x)
    return out


def test_step_reward_is_progress_minus_time_and_the_goal_adds_ten() -> None:
    sim = make_sim(Scenario.make([[10, 10]], [[16, 10]], [0.0]))  # reached once x >= 4 (2 m from the goal)
    rewards = []
    for _ in range(30):
        result = sim.step(np.array([[FULL_AHEAD]]))
        rewards.append(result.reward[0, 0])
        if result.terminated[0, 0]:
            break
    xs = surge_positions(len(rewards))
    assert xs[-2] < 4.0 <= xs[-1], "the goal step is the first within 2 m"
    assert result.outcome[0, 0] == C.GOAL and result.env_terminated[0] and not sim.active[0, 0]
    expected = -0.1 + np.diff([0.0, *xs])  # distance to the goal falls by the distance run
    expected[-1] += 10.0
    np.testing.assert_allclose(rewards, expected, atol=1e-9)


def test_collision_with_an_obstacle_costs_five_and_stops_the_robot() -> None:
    # Obstacle of radius 1 centred 8 m ahead: contact once x >= 8 - 1 - R.
    scenario = Scenario.make(
        [[10, 10], [10, 40]], [[50, 10], [50, 40]], [0.0, 0.0], obstacles=[[18, 10, 1.0]]
    )
    sim = make_sim(scenario)
    rewards = []
    for _ in range(30):
        result = sim.step(np.array([[FULL_AHEAD, COAST]]))
        rewards.append(result.reward[0, 0])
        if result.terminated[0, 0]:
            break
    xs = surge_positions(len(rewards))
    assert xs[-2] < 7.0 - RADIUS <= xs[-1]
    assert result.outcome[0].tolist() == [C.COLLISION, C.RUNNING]
    expected = -0.1 + np.diff([0.0, *xs])
    expected[-1] -= 5.0
    np.testing.assert_allclose(rewards, expected, atol=1e-9)
    # The other robot goes on; the stopped one no longer moves, observes or earns.
    assert not result.env_terminated[0] and sim.active[0].tolist() == [False, True]
    frozen = sim.pos[0, 0].copy()
    later = sim.step(np.array([[FULL_AHEAD, FULL_AHEAD]]))
    np.testing.assert_array_equal(sim.pos[0, 0], frozen)
    assert later.reward[0, 0] == 0.0 and not later.terminated[0, 0]
    np.testing.assert_array_equal(later.obs[0, 0], 0.0)
    assert later.outcome[0, 0] == C.COLLISION
    assert sim.thrust[0, 1].tolist() == [500.0, 500.0]


def test_two_vessels_collide_together_and_vanish_from_the_third_ones_view() -> None:
    # Head-on at 10 m; a third robot 12 m to the north sees both until they collide.
    starts = [[10, 10], [20, 10], [15, 22]]
    scenario = Scenario.make(starts, [[50, 10], [-30, 10], [15, 52]], [0.0, math.pi, math.pi / 2])
    sim = make_sim(scenario)
    _, _, mask = split_observation(sim.observe()[0, 2])
    assert mask.sum() == 2
    for _ in range(30):
        result = sim.step(np.array([[FULL_AHEAD, FULL_AHEAD, COAST]]))
        if result.terminated[0].any():
            break
    assert result.terminated[0].tolist() == [True, True, False]
    assert result.outcome[0].tolist() == [C.COLLISION, C.COLLISION, C.RUNNING]
    # Contact: centres closer than two radii.
    gap = np.linalg.norm(sim.pos[0, 0] - sim.pos[0, 1])
    assert gap <= 2 * RADIUS
    later = sim.step(np.array([[COAST, COAST, COAST]]))
    _, _, mask = split_observation(later.obs[0, 2])
    assert mask.sum() == 0, "stopped vessels are gone from the map"


def test_timeout_is_the_1001st_step_truncated_without_a_terminal_reward() -> None:
    sim = make_sim(Scenario.make([[10, 10], [40, 40]], [[50, 10], [10, 40]], [0.0, 0.0]))
    sim.steps[:] = 999
    result = sim.step(np.array([[COAST, COAST]]))
    assert not result.env_truncated[0] and not result.truncated.any()
    result = sim.step(np.array([[COAST, COAST]]))
    assert result.env_truncated[0] and not result.env_terminated[0]
    assert result.truncated[0].tolist() == [True, True] and not result.terminated.any()
    assert result.outcome[0].tolist() == [C.TIMEOUT, C.TIMEOUT]
    np.testing.assert_allclose(result.reward[0], -0.1, atol=1e-12)  # at rest: no progress


def colregs_phi(own_pos, own_theta, own_vel, other_pos, other_r=RADIUS) -> float:
    """The desired turn φ of section 5, by hand, from world-frame positions and the own velocity."""
    dx, dy = other_pos[0] - own_pos[0], other_pos[1] - own_pos[1]
    c, s = math.cos(own_theta), math.sin(own_theta)
    px, py = c * dx + s * dy, -s * dx + c * dy
    vx, vy = c * own_vel[0] + s * own_vel[1], -s * own_vel[0] + c * own_vel[1]
    base, dist = other_r + 1.0, math.hypot(px, py)
    desired = math.atan2(py, px) + math.asin(base / dist) + math.atan2(RADIUS, math.sqrt(dist**2 - base**2))
    wrap = lambda a: (a + math.pi) % (2 * math.pi) - math.pi  # noqa: E731
    return wrap(wrap(desired) - math.atan2(vy, vx))


def test_head_on_meeting_costs_the_colregs_turn_angle() -> None:
    scenario = Scenario.make([[10, 10], [24, 10]], [[50, 10], [-30, 10]], [0.0, math.pi])
    sim = make_sim(scenario)
    sim.vel_r[0, :, :2] = sim.vel[0, :, :2] = [[2.0, 0.0], [-2.0, 0.0]]
    before = sim.pos[0].copy()
    result = sim.step(np.array([[COAST, COAST]]))
    assert sim.colregs[0].tolist() == [True, True]
    for i, j in ((0, 1), (1, 0)):
        phi = colregs_phi(sim.pos[0, i], sim.theta[0, i], sim.vel[0, i, :2], sim.pos[0, j])
        assert 0.0 < phi < math.pi / 2
        progress = np.linalg.norm(sim.goal[0, i] - before[i]) - np.linalg.norm(sim.goal[0, i] - sim.pos[0, i])
        assert result.reward[0, i] == pytest.approx(-0.1 + progress - 0.1 * phi, abs=1e-9)


def test_overtaking_and_slow_vessels_are_not_colregs_encounters() -> None:
    # Both heading east, one behind the other: neither zone.
    scenario = Scenario.make([[10, 10], [20, 10]], [[50, 10], [50, 12]], [0.0, 0.0])
    sim = make_sim(scenario)
    sim.vel_r[0, :, :2] = sim.vel[0, :, :2] = [[2.0, 0.0], [1.0, 0.0]]
    before = sim.pos[0].copy()
    result = sim.step(np.array([[COAST, COAST]]))
    assert not sim.colregs.any()
    progress = np.linalg.norm(sim.goal[0] - before, axis=1) - np.linalg.norm(sim.goal[0] - sim.pos[0], axis=1)
    np.testing.assert_allclose(result.reward[0], -0.1 + progress, atol=1e-12)
    # Head-on, but one vessel is below 0.5 m/s: an encounter for neither (each needs both to move).
    sim = make_sim(Scenario.make([[10, 10], [24, 10]], [[50, 10], [-30, 10]], [0.0, math.pi]))
    sim.vel_r[0, :, :2] = sim.vel[0, :, :2] = [[2.0, 0.0], [-0.3, 0.0]]
    sim.step(np.array([[COAST, COAST]]))
    assert np.hypot(*sim.vel[0, 0, :2]) > 0.5 > np.hypot(*sim.vel[0, 1, :2])
    assert sim.colregs[0].tolist() == [False, False]


def test_left_crossing_vessel_gives_way() -> None:
    # Robot 0 heads west with robot 1 ahead on its starboard side, heading north across its course: in
    # robot 1's frame (x north, y west) robot 0 sits at (-5, -4) moving along +y, the left-crossing zone.
    scenario = Scenario.make([[14, 5], [10, 10]], [[-30, 5], [10, 50]], [math.pi, math.pi / 2])
    sim = make_sim(scenario)
    sim.vel_r[0, :, :2] = sim.vel[0, :, :2] = [[-2.0, 0.0], [0.0, 2.0]]
    sim.step(np.array([[COAST, COAST]]))
    phi = colregs_phi(sim.pos[0, 0], sim.theta[0, 0], sim.vel[0, 0, :2], sim.pos[0, 1])
    assert sim.colregs[0, 0] and sim.phi[0, 0] == pytest.approx(phi, abs=1e-9)


def test_objects_are_ordered_by_gap_not_by_centre_distance() -> None:
    # An obstacle 6 m north (gap 6 - 1 - R) and a vessel 6.5 m east (gap 6.5 - R - R, smaller).
    scenario = Scenario.make(
        [[10, 10], [16.5, 10]], [[50, 50], [50, 10]], [0.0, 0.0], obstacles=[[10, 16, 1.0]]
    )
    _, objects, mask = split_observation(make_sim(scenario).observe()[0, 0])
    np.testing.assert_array_equal(mask, [1, 1, 0, 0, 0])
    np.testing.assert_allclose(objects[:2, [0, 1, 4]], [[6.5, 0.0, RADIUS], [0.0, 6.0, 1.0]], atol=1e-5)


def test_turning_while_moving_follows_the_3dof_equations_by_hand() -> None:
    sim = make_sim(Scenario.make([[10, 10]], [[50, 50]], [0.4]))
    vx, vy, w, theta = 2.0 * math.cos(0.4), 2.0 * math.sin(0.4), 0.3, 0.4
    sim.vel_r[0, 0] = sim.vel[0, 0] = [vx, vy, w]
    left, right = 800.0, 200.0
    sim.thrust[0, 0] = [left, right]
    sim.step(np.array([[COAST]]))
    m = 400.0
    for _ in range(C.SUBSTEPS):
        theta += w * C.DT
        c, s = math.cos(theta), math.sin(theta)
        u, v = c * vx + s * vy, -s * vx + c * vy
        acc_u = (m * w * v - (100.0 + 150.0 * abs(u)) * u + left + right) / 380.0
        acc_v = (-m * w * u + 20.0 * u * w - (100.0 + 150.0 * abs(v)) * v) / 400.0
        acc_w = (-20.0 * u * v - (980.0 + 950.0 * abs(w)) * w + 1.25 * (left - right)) / 1430.0
        u, v, w = u + acc_u * C.DT, v + acc_v * C.DT, w + acc_w * C.DT
        vx, vy = c * u - s * v, s * u + c * v
    np.testing.assert_allclose(sim.vel_r[0, 0], [vx, vy, w], atol=1e-12)
    assert sim.theta[0, 0] == pytest.approx(theta, abs=1e-12)


def test_a_collision_on_the_timeout_step_counts_as_timeout() -> None:
    # The robot starts touching an obstacle (flagged at reset); its first step is the 1001st.
    scenario = Scenario.make([[10, 10]], [[50, 10]], [0.0], obstacles=[[13, 10, 1.0]])
    sim = make_sim(scenario)
    assert sim.collided[0, 0]
    sim.steps[:] = 1000
    result = sim.step(np.array([[COAST]]))
    assert result.outcome[0, 0] == C.TIMEOUT and result.truncated[0, 0] and not result.terminated[0, 0]
    assert result.reward[0, 0] == pytest.approx(-0.1, abs=1e-12)  # no -5
