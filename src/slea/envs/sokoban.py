"""Sokoban as text (``slea/Sokoban-v0``): our own generator of solvable rooms, no gym-sokoban needed.

Generation (deterministic in the seed; stdlib ``random.Random`` only):

1. carve a room: a random walk with random turns inside a wall border (``dim`` = rows x cols, border
   included), until at least ``num_boxes + 3`` floor cells exist;
2. put ``num_boxes`` targets and the player on random floor cells, every box on a target (the solved state);
3. *reverse-play*: random player moves in which the player may *pull* a box that is behind it (a pull is
   the inverse of a push, so every reached state can be pushed back to the solved one); the reached state
   that scores best (box displacement x number of box moves) and has a box off its target is the puzzle;
4. the walkthrough is a shortest solution found by BFS over (player, boxes) (capped at ``max_bfs_states``;
   beyond the cap the reversed pull sequence is used, which is a valid if longer solution).

Seeds: ``reset(seed=k)`` plays room ``k`` of the split (``k % num_games`` when ``num_games`` is set);
train rooms use internal seed ``2k`` and held-out rooms ``2k + 1``, so the two splits never share a seed.
``options={"game": k}`` does the same as ``seed=k``; ``options={"level": "<XSB text>"}`` plays a given board.

Observation: the board (``#`` wall, ``_`` floor, ``.`` target, ``$`` box, ``*`` box on target, ``@`` you,
``+`` you on a target) and, with ``coords=True``, the positions in words. It depends only on the state, so
identical states give identical anchors; what the last move did is in ``info["feedback"]``. The legend, the
rules and the moves are the env's instructions (:data:`INSTRUCTIONS`, with a one-move example), not part of
the observation.
Actions: ``up``, ``down``, ``left``, ``right`` (case, brackets and surrounding punctuation are ignored; the
aliases ``north/south/west/east`` are accepted); anything else is ``invalid``. Bumping a wall or an immovable
box is a valid move that changes nothing. Reward: 1 when every box is on a target (episode ends), plus
``box_reward`` per box pushed onto (minus per box pushed off) a target, minus ``step_penalty`` per valid
move. ``info["lost"]`` flags a simple deadlock (a box off-target in a corner); with
``terminate_on_deadlock=True`` the episode then ends. Max steps are the rollout collector's business.
``get_state()/set_state()`` are exact snapshots (no replay needed).

State key (:func:`board_key`, read from the board in the observation): what the player has next to it on each
side, where the nearest loose box is, where that box's nearest free target is, and how many boxes are placed;
the room's layout and positions are dropped (room 0: ``up free, down free, left wall, right wall; loose box
up-right, its target down; 0/1 placed``).
"""

from __future__ import annotations

import functools
import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from slea.envs.base import StepResult, TextEnv, register, user_turn
from slea.types import Instructions, StateKey

Pos = tuple[int, int]
ACTIONS = ("up", "down", "left", "right")
MOVES: dict[str, Pos] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_ALIASES = {
    "north": "up",
    "south": "down",
    "west": "left",
    "east": "right",
    "u": "up",
    "d": "down",
    "l": "left",
    "r": "right",
}
LEGEND = "Legend: # wall, _ floor, . target, $ box, * box on target, @ you, + you on a target."
GOAL = "Push every box ($) onto a target (.)."


@dataclass(frozen=True)
class Room:
    """An immutable puzzle: the static grid (walls ``#``, floor ``_``, targets ``.``), the start, a solution."""

    grid: tuple[str, ...]
    player: Pos
    boxes: frozenset[Pos]
    solution: tuple[str, ...] = ()

    @property
    def targets(self) -> frozenset[Pos]:
        return frozenset((r, c) for r, row in enumerate(self.grid) for c, ch in enumerate(row) if ch == ".")

    def is_wall(self, pos: Pos) -> bool:
        r, c = pos
        return not (0 <= r < len(self.grid) and 0 <= c < len(self.grid[r])) or self.grid[r][c] == "#"


def _add(a: Pos, b: Pos) -> Pos:
    return (a[0] + b[0], a[1] + b[1])


def _sub(a: Pos, b: Pos) -> Pos:
    return (a[0] - b[0], a[1] - b[1])


# ------------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------------
def _carve(rng: random.Random, rows: int, cols: int, min_floor: int) -> set[Pos]:
    """Floor cells from a random walk with random turns inside the border, covering 50-80% of the inside."""
    inner = [(r, c) for r in range(1, rows - 1) for c in range(1, cols - 1)]
    want = max(min_floor, round(len(inner) * (0.5 + 0.3 * rng.random())))
    pos = rng.choice(inner)
    floor = {pos}
    direction = rng.choice(list(MOVES.values()))
    for _ in range(50 * len(inner)):
        if len(floor) >= want:
            break
        if rng.random() < 0.35:
            direction = rng.choice(list(MOVES.values()))
        nxt = _add(pos, direction)
        if 1 <= nxt[0] < rows - 1 and 1 <= nxt[1] < cols - 1:
            pos = nxt
            floor.add(pos)
        else:
            direction = rng.choice(list(MOVES.values()))
    return floor


def _reverse_play(
    rng: random.Random, floor: set[Pos], targets: frozenset[Pos], player: Pos, steps: int
) -> tuple[Pos, frozenset[Pos], list[str]] | None:
    """Random moves with pulls from the solved state; return the best puzzle state and its solution."""
    boxes = set(targets)
    start_of = {b: b for b in boxes}  # box -> the target it started on (for the displacement score)
    moves: list[str] = []  # forward-direction names of the reverse moves made so far
    best: tuple[float, Pos, frozenset[Pos], int] | None = None
    box_moves = 0
    for _ in range(steps):
        name = rng.choice(ACTIONS)
        d = MOVES[name]
        nxt = _add(player, d)
        if nxt not in floor or nxt in boxes:
            continue
        behind = _sub(player, d)
        if behind in boxes and rng.random() < 0.7:  # pull the box behind us along
            boxes.remove(behind)
            boxes.add(player)
            start_of[player] = start_of.pop(behind)
            box_moves += 1
        player = nxt
        # Forward, the player undoes this move by walking/pushing the opposite way.
        moves.append({"up": "down", "down": "up", "left": "right", "right": "left"}[name])
        if not boxes <= targets:
            disp = sum(abs(b[0] - s[0]) + abs(b[1] - s[1]) for b, s in start_of.items())
            score = float(disp * box_moves)
            if best is None or score > best[0]:
                best = (score, player, frozenset(boxes), len(moves))
    if best is None:
        return None
    _, p, bxs, n = best
    return p, bxs, list(reversed(moves[:n]))


def solve(
    room: Room, player: Pos | None = None, boxes: frozenset[Pos] | None = None, max_states: int = 200_000
) -> list[str] | None:
    """A shortest (in moves) solution by BFS, or ``None`` if unsolvable or over ``max_states`` states."""
    targets = room.targets
    start = (player if player is not None else room.player, boxes if boxes is not None else room.boxes)
    if start[1] <= targets:
        return []
    parent: dict[tuple[Pos, frozenset[Pos]], tuple[tuple[Pos, frozenset[Pos]], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        pl, bxs = state
        for name in ACTIONS:
            d = MOVES[name]
            nxt = _add(pl, d)
            if room.is_wall(nxt):
                continue
            if nxt in bxs:
                beyond = _add(nxt, d)
                if room.is_wall(beyond) or beyond in bxs:
                    continue
                new_boxes = (bxs - {nxt}) | {beyond}
            else:
                new_boxes = bxs
            new = (nxt, new_boxes)
            if new in parent:
                continue
            parent[new] = (state, name)
            if new_boxes <= targets:
                path = []
                cur: Any = new
                while parent[cur] is not None:
                    cur, move = parent[cur]
                    path.append(move)
                return path[::-1]
            if len(parent) > max_states:
                return None
            queue.append(new)
    return None


def replay(room: Room, actions: list[str] | tuple[str, ...]) -> tuple[Pos, frozenset[Pos]]:
    """The (player, boxes) reached by playing ``actions`` from the room's start."""
    player, boxes = room.player, room.boxes
    for name in actions:
        player, boxes, _ = _move(room, player, boxes, name)
    return player, boxes


def _move(room: Room, player: Pos, boxes: frozenset[Pos], name: str) -> tuple[Pos, frozenset[Pos], str]:
    d = MOVES[name]
    nxt = _add(player, d)
    if room.is_wall(nxt):
        return player, boxes, "You bump into a wall."
    if nxt in boxes:
        beyond = _add(nxt, d)
        if room.is_wall(beyond) or beyond in boxes:
            return player, boxes, "The box does not move."
        return nxt, (boxes - {nxt}) | {beyond}, f"You push the box {name}."
    return nxt, boxes, f"You move {name}."


def _reverse_bfs(
    floor: set[Pos], targets: frozenset[Pos], max_states: int
) -> list[tuple[Pos, frozenset[Pos], int, Any]] | None:
    """Exhaustive reverse play: BFS over pulls and walks from every solved state.

    Returns ``(player, boxes, distance, parent_key)`` rows in BFS order, where ``distance`` is the length of a
    shortest forward solution; ``None`` when the state space exceeds ``max_states``.
    """
    opposite = {"up": "down", "down": "up", "left": "right", "right": "left"}
    parent: dict[tuple[Pos, frozenset[Pos]], tuple[tuple[Pos, frozenset[Pos]], str] | None] = {}
    dist: dict[tuple[Pos, frozenset[Pos]], int] = {}
    queue: deque[tuple[Pos, frozenset[Pos]]] = deque()
    for cell in sorted(floor - targets):
        key = (cell, targets)
        parent[key], dist[key] = None, 0
        queue.append(key)
    while queue:
        state = queue.popleft()
        player, boxes = state
        for name in ACTIONS:
            d = MOVES[name]
            nxt = _add(player, d)
            if nxt not in floor or nxt in boxes:
                continue
            behind = _sub(player, d)
            succ = [(nxt, boxes)]
            if behind in boxes:  # pull the box behind the player onto the player's old cell
                succ.append((nxt, (boxes - {behind}) | {player}))
            for new in succ:
                if new in parent:
                    continue
                parent[new] = (state, opposite[name])  # forward: walk/push back the other way
                dist[new] = dist[state] + 1
                if len(parent) > max_states:
                    return None
                queue.append(new)
    return [(p, b, dist[(p, b)], parent[(p, b)]) for (p, b) in parent]


def _path_to_goal(parents: dict[Any, Any], key: Any) -> list[str]:
    path = []
    while parents[key] is not None:
        key, move = parents[key]
        path.append(move)
    return path


@functools.lru_cache(maxsize=4096)
def generate_room(
    seed: int,
    dim: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    difficulty: float = 0.5,
    max_bfs_states: int = 200_000,
    reverse_steps: int = 300,
    max_tries: int = 100,
) -> Room:
    """A solvable room from ``seed`` (deterministic); ``dim`` = (rows, cols) including the wall border.

    ``difficulty`` in [0, 1] picks the start among the states reverse play reaches: the shortest solution
    length is ``max(1, round(difficulty * longest))`` where ``longest`` is the hardest start of that layout.
    Rooms whose state space exceeds ``max_bfs_states`` fall back to a random reverse play of
    ``reverse_steps`` moves (the start that maximises box displacement x box moves).
    """
    rows, cols = int(dim[0]), int(dim[1])
    if num_boxes < 1:
        raise ValueError("num_boxes must be >= 1")
    if rows < 3 or cols < 3 or (rows - 2) * (cols - 2) < num_boxes + 3:
        raise ValueError(f"room {dim} is too small for {num_boxes} box(es)")
    if not 0.0 <= difficulty <= 1.0:
        raise ValueError("difficulty must be in [0, 1]")
    rng = random.Random(int(seed))
    for _ in range(max_tries):
        floor = _carve(rng, rows, cols, min_floor=num_boxes + 3)
        if len(floor) < num_boxes + 3:
            continue
        cells = sorted(floor)
        rng.shuffle(cells)
        targets = frozenset(cells[:num_boxes])
        grid = tuple(
            "".join("." if (r, c) in targets else "_" if (r, c) in floor else "#" for c in range(cols))
            for r in range(rows)
        )
        rows_ = _reverse_bfs(floor, targets, max_bfs_states)
        if rows_ is not None:
            longest = max(d for _, _, d, _ in rows_)
            if longest == 0:
                continue  # no box can leave its target in this layout
            want = max(1, round(difficulty * longest))
            candidates = [(p, b) for p, b, d, _ in rows_ if d == want]
            player, boxes = candidates[rng.randrange(len(candidates))]
            parents = {(p, b): par for p, b, _, par in rows_}
            solution = _path_to_goal(parents, (player, boxes))
        else:
            found = _reverse_play(rng, floor, targets, cells[num_boxes], reverse_steps)
            if found is None:
                continue
            player, boxes, solution = found
        room = Room(grid, player, boxes)
        if not solution or not replay(room, solution)[1] <= targets:
            continue  # cannot happen for a correct reverse play; retry rather than emit a bad room
        return Room(grid, player, boxes, tuple(solution))
    raise RuntimeError(f"could not generate a {dim} room with {num_boxes} box(es) from seed {seed}")


def parse_level(text: str) -> Room:
    """A room from XSB text (``#`` wall, ``_``/``-``/space floor, ``.`` target, ``$`` box, ``*``, ``@``, ``+``)."""
    lines = [ln.rstrip("\n") for ln in text.strip("\n").splitlines()]
    width = max(len(ln) for ln in lines)
    grid, boxes, player = [], set(), None
    for r, line in enumerate(lines):
        row = []
        for c, ch in enumerate(line.ljust(width, "#")):
            if ch in "@+":
                player = (r, c)
            if ch in "$*":
                boxes.add((r, c))
            row.append("#" if ch == "#" else "." if ch in ".*+" else "_")
        grid.append("".join(row))
    if player is None or not boxes:
        raise ValueError("a level needs a player (@ or +) and at least one box ($ or *)")
    room = Room(tuple(grid), player, frozenset(boxes))
    return Room(room.grid, room.player, room.boxes, tuple(solve(room) or ()))


def render(room: Room, player: Pos, boxes: frozenset[Pos], coords: bool = True) -> str:
    """The observation text: the board and (optionally) positions in words (rows/cols from 0)."""
    rows = []
    for r, line in enumerate(room.grid):
        row = []
        for c, ch in enumerate(line):
            pos = (r, c)
            target = ch == "."
            if pos == player:
                row.append("+" if target else "@")
            elif pos in boxes:
                row.append("*" if target else "$")
            else:
                row.append(ch)
        rows.append("".join(row))
    text = "\n".join(rows)
    if coords:

        def fmt(ps: Any) -> str:
            return ", ".join(f"(row {r}, col {c})" for r, c in sorted(ps))

        on = len(boxes & room.targets)
        text += (
            f"\n\nYou are at {fmt([player])}. Boxes: {fmt(boxes)}. Targets: {fmt(room.targets)}."
            f" Boxes on targets: {on}/{len(boxes)}."
        )
    return text


def deadlocked(room: Room, boxes: frozenset[Pos]) -> bool:
    """A simple deadlock: some box off its target sits in a corner (two orthogonal walls)."""
    targets = room.targets
    for b in boxes - targets:
        up, down = room.is_wall(_add(b, (-1, 0))), room.is_wall(_add(b, (1, 0)))
        left, right = room.is_wall(_add(b, (0, -1))), room.is_wall(_add(b, (0, 1)))
        if (up or down) and (left or right):
            return True
    return False


_BOARD_CHARS = frozenset("#_.$*@+")


def _compass(dr: int, dc: int) -> str:
    """The direction of a vector as one of 8 compass words (``up``, ``down-left``, ...) or ``here``."""
    vert = "up" if dr < 0 else "down" if dr > 0 else ""
    horiz = "left" if dc < 0 else "right" if dc > 0 else ""
    return "-".join(w for w in (vert, horiz) if w) or "here"


def board_key(observation: str) -> StateKey | None:
    """Sokoban's state key of an observation, read from its board only (the lines of board symbols at its top).

    The text names, for each move, what the player would walk into (``wall``, ``free`` floor or target, a ``box``
    that would move, a ``stuck box`` with a wall or a box behind it, a ``placed box`` on its target), the
    direction of the nearest box off a target (``loose box``), the direction from that box to its nearest free
    target, how many boxes are placed, and ``a box is cornered`` when a loose box sits in a corner (a deadlock).
    Positions, the room's size and layout are dropped. No slots (boxes and targets have no names). None when the
    observation holds no board with a player."""
    rows = []
    for line in observation.splitlines():
        if not line or not set(line) <= _BOARD_CHARS:
            break
        rows.append(line)
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    player = next((p for p, ch in sorted(cells.items()) if ch in "@+"), None)
    if player is None:
        return None

    def at(p: Pos) -> str:
        return cells.get(p, "#")

    sides = []
    for name in ACTIONS:
        nxt = _add(player, MOVES[name])
        ch, beyond = at(nxt), at(_add(nxt, MOVES[name]))
        what = {"#": "wall", "_": "free", ".": "free", "*": "placed box"}.get(ch)
        if what is None:  # a box off its target
            what = "box" if beyond in "_." else "stuck box"
        sides.append(f"{name} {what}")
    loose = sorted(p for p, ch in cells.items() if ch == "$")
    boxes = sum(ch in "$*" for ch in cells.values())
    placed = f"{boxes - len(loose)}/{boxes} placed"
    if not loose:
        return StateKey(f"{', '.join(sides)}; all {boxes} boxes placed")

    def dist(a: Pos, b: Pos) -> int:
        return abs(a[0] - b[0]) + abs(a[1] - b[1])

    box = min(loose, key=lambda p: dist(p, player))
    free = sorted(p for p, ch in cells.items() if ch in ".+")
    target = min(free, key=lambda p: dist(p, box)) if free else box
    text = (f"{', '.join(sides)}; loose box {_compass(*_sub(box, player))}, its target "
            f"{_compass(*_sub(target, box))}; {placed}")
    cornered = any((at(_add(b, (-1, 0))) == "#" or at(_add(b, (1, 0))) == "#")
                   and (at(_add(b, (0, -1))) == "#" or at(_add(b, (0, 1))) == "#") for b in loose)
    return StateKey(text + ("; a box is cornered" if cornered else ""))


def normalize_action(action: str) -> str | None:
    """``up``/``down``/``left``/``right`` from a loosely written action, or ``None``."""
    words = re.sub(r"[^a-z ]", " ", str(action).lower()).split()
    if len(words) == 2 and words[0] in ("move", "go", "push", "walk"):
        words = words[1:]
    if len(words) != 1:
        return None
    word = _ALIASES.get(words[0], words[0])
    return word if word in MOVES else None


_EXAMPLE = parse_level("#####\n#@$.#\n#####")
INSTRUCTIONS = Instructions(
    system="You are playing Sokoban. " + LEGEND + " Walk into a box to push it; boxes cannot be pulled. "
    "Reply with exactly one move: up, down, left or right.",
    example=((user_turn(GOAL, render(_EXAMPLE, _EXAMPLE.player, _EXAMPLE.boxes), list(ACTIONS),
                             cue="Your move:"), "right"),),
    answer_cue="Your move:",
)


# ------------------------------------------------------------------------------------------------------
# The environment
# ------------------------------------------------------------------------------------------------------
class SokobanEnv(TextEnv):
    """Text Sokoban (see the module docstring).

    Args:
        dim: (rows, cols) of the room, wall border included (default 6x6).
        num_boxes: boxes (and targets) per room.
        split: ``"train"`` or ``"heldout"`` (disjoint internal seeds).
        num_games: if set, ``reset(seed=k)`` plays room ``k % num_games`` (a finite task set).
        difficulty: 0..1, the shortest-solution length as a fraction of the layout's hardest start.
        reverse_steps: length of the random reverse play used when a room's state space is too big.
        step_penalty: subtracted from the reward of every valid move.
        box_reward: added per box pushed onto a target (subtracted per box pushed off one).
        coords: add the positions in words below the board.
        terminate_on_deadlock: end the episode (``lost``) when a box is stuck in a corner.
    """

    snapshots = "exact"  # get_state/set_state: the state itself, copied

    task_type = "sokoban"

    def __init__(
        self,
        dim: tuple[int, int] | list[int] = (6, 6),
        num_boxes: int = 1,
        split: str = "train",
        num_games: int | None = None,
        difficulty: float = 0.5,
        reverse_steps: int = 300,
        step_penalty: float = 0.0,
        box_reward: float = 0.0,
        coords: bool = True,
        terminate_on_deadlock: bool = False,
        max_bfs_states: int = 200_000,
    ) -> None:
        super().__init__()
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        if num_games is not None and num_games < 1:
            raise ValueError("num_games must be >= 1")
        self.dim = (int(dim[0]), int(dim[1]))
        self.num_boxes = int(num_boxes)
        self.split = split
        self.num_games = num_games
        self.difficulty = float(difficulty)
        self.reverse_steps = int(reverse_steps)
        self.step_penalty = float(step_penalty)
        self.box_reward = float(box_reward)
        self.coords = coords
        self.terminate_on_deadlock = terminate_on_deadlock
        self.max_bfs_states = int(max_bfs_states)
        self._room: Room | None = None
        self._player: Pos = (0, 0)
        self._boxes: frozenset[Pos] = frozenset()
        self._game: int | None = None
        self._won = self._lost = self._done = False
        self._feedback = ""
        self._admissible = list(ACTIONS)
        self._goal = GOAL

    instructions = INSTRUCTIONS
    expert_source = "solver"  # info["walkthrough"]: a shortest solution (BFS)

    def room_seed(self, game: int) -> int:
        """The internal generator seed of room ``game`` of this split."""
        if self.num_games is not None:
            game %= self.num_games
        return 2 * int(game) + (1 if self.split == "heldout" else 0)

    def room(self, game: int) -> Room:
        return generate_room(
            self.room_seed(game),
            self.dim,
            self.num_boxes,
            self.difficulty,
            self.max_bfs_states,
            self.reverse_steps,
        )

    def _reset(self, seed: int | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if options.get("level"):
            self._room, self._game = parse_level(str(options["level"])), None
        else:
            game = self._pick(self.num_games, seed, options)
            self._room, self._game = self.room(game), game
        self._player, self._boxes = self._room.player, self._room.boxes
        self._won = self._boxes <= self._room.targets
        self._lost = deadlocked(self._room, self._boxes)
        self._done = self._won
        self._feedback = ""
        return self._observation(), {}

    def _observation(self) -> str:
        assert self._room is not None
        return render(self._room, self._player, self._boxes, self.coords)

    def _step(self, action: str) -> StepResult:
        if self._room is None:
            return self._reject("Call reset() before step().")
        if self._done:
            return self._reject("The episode is over.")
        name = normalize_action(action)
        if name is None:
            return (
                self._last_obs,
                0.0,
                False,
                False,
                {"invalid": True, "error": "Not a valid action: answer up, down, left or right."},
            )
        targets = self._room.targets
        before = len(self._boxes & targets)
        self._player, self._boxes, self._feedback = _move(self._room, self._player, self._boxes, name)
        after = len(self._boxes & targets)
        self._won = self._boxes <= targets
        self._lost = not self._won and deadlocked(self._room, self._boxes)
        self._done = self._won or (self._lost and self.terminate_on_deadlock)
        reward = (after - before) * self.box_reward - self.step_penalty + (1.0 if self._won else 0.0)
        return self._observation(), reward, self._done, False, {"invalid": False}

    def _info_defaults(self) -> dict[str, Any]:
        room = self._room
        return {
            "won": self._won,
            "lost": self._lost,
            "walkthrough": list(room.solution) if room else [],
            "feedback": self._feedback,
            "game": self._game,
            "boxes_on_target": len(self._boxes & room.targets) if room else 0,
            "num_boxes": len(room.boxes) if room else self.num_boxes,
        }

    def state_key(self, observation: str) -> StateKey | None:
        """The board's structure around the player (:func:`board_key`), read from the observation alone. Keeps:
        what each move walks into (wall, free cell, a box that moves or is stuck, a placed box), the directions
        of the nearest loose box and of its nearest free target, the boxes placed, a cornered box. Drops: the
        room's size, layout and positions, and the positions in words. Never reads the solution. Example:
        ``up free, down free, left wall, right wall; loose box up-right, its target down; 0/1 placed``."""
        return board_key(observation)

    def get_state(self) -> dict[str, Any]:
        """An exact snapshot (the room is immutable and shared, the rest is copied)."""
        if self._room is None:
            raise RuntimeError("get_state() before reset()")
        return {
            "room": self._room,
            "game": self._game,
            "player": self._player,
            "boxes": self._boxes,
            "won": self._won,
            "lost": self._lost,
            "done": self._done,
            "feedback": self._feedback,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._room, self._game = state["room"], state["game"]
        self._player, self._boxes = tuple(state["player"]), frozenset(map(tuple, state["boxes"]))
        self._won, self._lost, self._done = state["won"], state["lost"], state["done"]
        self._feedback = state.get("feedback", "")
        self._last_obs = self._observation()

    def render(self) -> str:
        return self._last_obs


register(
    "slea/Sokoban-v0",
    "slea.envs.sokoban:SokobanEnv",
    family="sokoban",
    description="Text Sokoban: generated solvable 6x6 rooms with 1 box",
)
register(
    "slea/Sokoban-2box-v0",
    "slea.envs.sokoban:SokobanEnv",
    family="sokoban",
    description="Text Sokoban: generated solvable 7x7 rooms with 2 boxes",
    dim=(7, 7),
    num_boxes=2,
)
