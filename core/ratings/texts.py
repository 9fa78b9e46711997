"""The leaderboard's words in English and Simplified Chinese.

They live beside the statistics so that the chat (through core.texts, which
merges them into its own strings) and the offline command (`python -m core.ratings
--lang zh`) say the same things. Notes and effects are data (a key and values);
these templates turn them into sentences.
"""

from __future__ import annotations

STRINGS: dict[str, dict[str, str]] = {
    "en": {
        "leaderboard_title": "**Leaderboard** (ratings from {blind} blind vote(s); {compare} vote(s) cast with names visible are not rated)",
        "leaderboard_columns": "# | Backend | Rating | 95% interval | Votes | Wins | Ties | Losses | Both bad | Judged good | Judged bad | Median TTFT (ms) | Median decode (tokens/s) | Replies",
        "leaderboard_ranks": "**#** respects the intervals: 1 + the number of backends whose 95% interval lies wholly above this one's, so backends whose intervals overlap share a rank.",
        "leaderboard_comments": "{commented} of {votes} blind vote(s) came with a comment.",
        "leaderboard_note_no_votes": "No blind votes yet: vote in blind mode to rate the backends.",
        "leaderboard_note_few_votes": "Only {votes} vote(s) so far: ratings are rough. Keep voting: about {enough}+ votes, spread over the backend pairs, make the order meaningful.",
        "leaderboard_note_unvoted_backend": "{backend} has replies but no votes yet, so it has no rating.",
        "leaderboard_note_few_backend_votes": "{backend} has only {votes} vote(s): its rating is rough until it has {enough}+.",
        "leaderboard_note_won_every_round": "{backend} won every round it was in ({votes}): only the prior keeps its rating finite, so the real gap may be larger. Compare it with stronger or weaker backends too.",
        "leaderboard_note_lost_every_round": "{backend} lost every round it was in ({votes}): only the prior keeps its rating finite, so the real gap may be larger. Compare it with stronger or weaker backends too.",
        "leaderboard_note_unrated_named": "{votes} blind vote(s) are kept but not rated: their comment named a backend, or their voter chose to see what could name the columns before voting, so they were not blind any more.",
        "leaderboard_view": "This view: {view}, {votes} of {total} rated vote(s).",
        "leaderboard_view_category": "category **{category}**",
        "leaderboard_view_language": "language **{language}**",
        "leaderboard_views": "Votes by category: {categories}. By language: {languages}. Filter by typing e.g. `/leaderboard category=code lang=zh`.",
        "controlled_title": "**Ratings at equal {controls}** (from the same {votes} vote(s)): the backends' ratings once these differences between the two sides of each vote are held apart.",
        "control_speed": "speed",
        "control_length": "length",
        "control_style": "markdown style",
        "control_separator": ", ",
        "control_last_separator": " and ",
        "controlled_columns": "# | Backend | Controlled rating | 95% interval | Plain rating | Plain #",
        "effects_title": "**What sways the votes**, at equal quality (50% = no effect):",
        "effect_first_token": "A side whose first token came in half the time",
        "effect_decode": "A side that decodes twice as fast",
        "effect_length": "A reply twice as long (200 against 100 tokens)",
        "effect_headers": "A reply with 3 headers against none",
        "effect_lists": "A reply with 5 list items against none",
        "effect_bold": "A reply with 3 bold phrases against none",
        "effect_line": "{subject} wins {share}% of the votes (95% interval {low}–{high}%): {verdict}.",
        "verdict_favours": "people prefer it",
        "verdict_disfavours": "people hold it against the reply",
        "verdict_no_clear_effect": "no clear effect",
        "verdict_too_few_votes": "too few votes to tell",
        "effect_not_measured": "{subject}: not measured, no vote in this view showed such a difference.",
        "effect_not_measured_speed": "{subject}: not measured, no vote in this view showed speed before the vote (blind reveal “when all have finished” hides it; “at one common pace” shows it).",
        "controlled_note_controlled_few_votes": "Only {votes} vote(s) in this view: the controlled ratings and the effects need about {enough}+ votes to tell much.",
        "controlled_note_speed_hidden": "{hidden} of {votes} vote(s) showed no speed before the vote (blind reveal “when all have finished”, or no figures): for them speed counts as no difference.",
        "view_unknown_filter": "“{word}” is not a filter: use category=… and lang=…, e.g. `/leaderboard category=code lang=zh` (or just `/leaderboard`).",
        "view_unknown_category": "There is no category “{category}”. Categories: {known}.",
        "view_unknown_language": "There is no language “{language}”. Languages: {known}.",
    },
    "zh": {
        "leaderboard_title": "**排行榜**（评分来自 {blind} 次盲评投票；{compare} 次显示名称时的投票不计入评分）",
        "leaderboard_columns": "# | 后端 | 评分 | 95% 区间 | 票数 | 胜 | 平 | 负 | 都不好 | 评为好 | 评为差 | TTFT 中位数 (ms) | 解码速度中位数 (tokens/秒) | 回复数",
        "leaderboard_ranks": "**#** 是考虑区间的名次：1 + 95% 区间整体高于本后端区间的后端数目，因此区间重叠的后端名次相同。",
        "leaderboard_comments": "{votes} 次盲评投票中有 {commented} 次附有评论。",
        "leaderboard_note_no_votes": "还没有盲评投票：在盲评模式下投票即可为各后端评分。",
        "leaderboard_note_few_votes": "目前只有 {votes} 票：评分还很粗略。请继续投票：大约 {enough} 票以上、分布在各对后端之间，排名才有意义。",
        "leaderboard_note_unvoted_backend": "{backend} 有回复但还没有投票，因此没有评分。",
        "leaderboard_note_few_backend_votes": "{backend} 只有 {votes} 票：达到 {enough} 票以上之前，它的评分还很粗略。",
        "leaderboard_note_won_every_round": "{backend} 赢了它参加的每一轮（{votes} 轮）：只是先验让它的评分保持有限，真实差距可能更大。也请把它和更强或更弱的后端比较。",
        "leaderboard_note_lost_every_round": "{backend} 输了它参加的每一轮（{votes} 轮）：只是先验让它的评分保持有限，真实差距可能更大。也请把它和更强或更弱的后端比较。",
        "leaderboard_note_unrated_named": "有 {votes} 次盲评投票已保存但不计入评分：评论中提到了后端名称，或投票者在投票前选择查看了可能暴露各列后端的内容，投票已不再是盲评。",
        "leaderboard_view": "当前视图：{view}，共 {votes} 票（全部计分投票 {total} 票）。",
        "leaderboard_view_category": "类别 **{category}**",
        "leaderboard_view_language": "语言 **{language}**",
        "leaderboard_views": "按类别的票数：{categories}。按语言：{languages}。输入例如 `/leaderboard category=code lang=zh` 即可筛选。",
        "controlled_title": "**在{controls}相同时的评分**（来自同样的 {votes} 票）：把每次投票两侧在这些方面的差异单独计算之后，各后端的评分。",
        "control_speed": "速度",
        "control_length": "长度",
        "control_style": "Markdown 格式",
        "control_separator": "、",
        "control_last_separator": "、",
        "controlled_columns": "# | 后端 | 控制后评分 | 95% 区间 | 原始评分 | 原始名次",
        "effects_title": "**什么在左右投票**（质量相同时；50% = 没有影响）：",
        "effect_first_token": "首个 token 用时减半的一方",
        "effect_decode": "解码速度快一倍的一方",
        "effect_length": "长一倍的回复（200 对 100 个 token）",
        "effect_headers": "有 3 个标题而对方没有的回复",
        "effect_lists": "有 5 个列表项而对方没有的回复",
        "effect_bold": "有 3 处粗体而对方没有的回复",
        "effect_line": "{subject}赢得 {share}% 的投票（95% 区间 {low}–{high}%）：{verdict}。",
        "verdict_favours": "投票者偏爱这一点",
        "verdict_disfavours": "投票者因此不选它",
        "verdict_no_clear_effect": "没有明显影响",
        "verdict_too_few_votes": "票数太少，还无法判断",
        "effect_not_measured": "{subject}：未测量，这个视图中没有投票出现这样的差异。",
        "effect_not_measured_speed": "{subject}：未测量，这个视图中没有投票在投票前显示速度（盲评的“全部完成后”显示会隐藏速度；“以相同节奏”会显示）。",
        "controlled_note_controlled_few_votes": "这个视图中只有 {votes} 票：控制后的评分和各项影响需要大约 {enough} 票以上才能说明问题。",
        "controlled_note_speed_hidden": "{votes} 票中有 {hidden} 票在投票前没有显示速度（盲评“全部完成后”显示，或没有指标）：这些投票的速度按没有差异计算。",
        "view_unknown_filter": "“{word}”不是筛选条件：请使用 category=… 和 lang=…，例如 `/leaderboard category=code lang=zh`（或只输入 `/leaderboard`）。",
        "view_unknown_category": "没有类别“{category}”。可选类别：{known}。",
        "view_unknown_language": "没有语言“{language}”。可选语言：{known}。",
    },
}


def render(strings: dict[str, dict[str, str]], key: str, lang: str = "en", **values: object) -> str:
    """`strings[lang][key]` filled with `values`; English where `lang` or the key is missing."""
    template = strings.get(lang, strings["en"]).get(key) or strings["en"][key]
    return template.format(**values) if values else template


def text(key: str, lang: str = "en", **values: object) -> str:
    """The leaderboard's sentence for `key` in `lang` ("en" or "zh")."""
    return render(STRINGS, key, lang, **values)
